// UCX defaults from the listen address (TLS, NET_DEVICES, REUSEADDR) unless the environment sets them (ucx_env.hpp).
#include "transport/ucx/ucx_env.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <cstdlib>
#include <memory>
#include <mutex>

namespace geoloco::transport::ucx {

std::string interface_for_address(const std::string& address) {
  struct in_addr want {};
  if (inet_pton(AF_INET, address.c_str(), &want) != 1 || want.s_addr == htonl(INADDR_ANY)) return {};
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return {};
  std::unique_ptr<struct ifaddrs, void (*)(struct ifaddrs*)> guard(list, freeifaddrs);
  for (auto* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if (reinterpret_cast<const struct sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == want.s_addr) return i->ifa_name;
  }
  // Any 127/8 address is carried by the loopback interface even when only 127.0.0.1 is listed.
  if ((ntohl(want.s_addr) >> 24) == 127) return "lo";
  return {};
}

std::vector<std::string> apply_ucx_defaults(Config& config, const std::string& listen_host) {
  // setenv below may reallocate the environment: several transports starting at once in one
  // process (ranks as threads) must not read it meanwhile (a TSan report).
  static std::mutex env_mu;
  std::lock_guard<std::mutex> lock(env_mu);
  std::vector<std::string> notes;
  auto set = [&](const std::string& name, const std::string& value) {
    if (config.set_default(name, value))
      notes.push_back(fmt::format("{}={}", name, value));
    else
      notes.push_back(fmt::format("{}={} (from the environment)", name, std::getenv(("UCX_" + name).c_str())));
  };
  set("TLS", "tcp");
  // UCX 1.13 reads connection-manager settings from the environment when the worker opens
  // its CMs; ucp_config_modify does not reach them (it only warns "invalid configuration").
  // So this one goes into the environment, unless the user already set it.
  if (std::getenv("UCX_TCP_CM_REUSEADDR") == nullptr) {
    setenv("UCX_TCP_CM_REUSEADDR", "y", 0);
    notes.push_back("TCP_CM_REUSEADDR=y (via the environment)");
  } else {
    notes.push_back(fmt::format("TCP_CM_REUSEADDR={} (from the environment)", std::getenv("UCX_TCP_CM_REUSEADDR")));
  }
  std::string iface = interface_for_address(listen_host);
  if (!iface.empty()) set("NET_DEVICES", iface);
  return notes;
}

}  // namespace geoloco::transport::ucx
