// The UCX environment pitfalls measured in shared/ENVIRONMENT.md, handled here so users
// never have to export UCX_* variables:
//  * UCX uses every interface it finds -> NET_DEVICES is pinned to the interface that
//    carries the listen address (lo for 127.0.0.1), found with getifaddrs.
//  * rebinding a just-used port fails ("Address already in use") -> TCP_CM_REUSEADDR=y.
//  * TLS=tcp: the WAN path is TCP; shared memory would make loopback tests unrepresentative.
// A UCX_<NAME> variable in the environment overrides each default (logged at startup).
#pragma once

#include <string>
#include <vector>

#include "transport/ucx/ucx_handles.hpp"

namespace geoloco::transport::ucx {

// Name of the interface holding IPv4 `address` ("" for 0.0.0.0 or when none matches).
std::string interface_for_address(const std::string& address);

// Applies geoloco's defaults to `config`; returns "NAME=value" lines describing what was set
// and which were left to the user's environment.
std::vector<std::string> apply_ucx_defaults(Config& config, const std::string& listen_host);

}  // namespace geoloco::transport::ucx
