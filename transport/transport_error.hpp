// geoloco::transport errors. All are run-time failures (geoloco::Error, CLI exit 1): a peer
// died, timed out, was refused at the handshake or sent a malformed frame. Messages always
// name the peer (site/rank host:port) and the operation; the key bytes are never included.
#pragma once

#include <ucs/type/status.h>

#include <string>

#include "trainer/core/error.hpp"

namespace geoloco::transport {

class TransportError : public geoloco::Error {
 public:
  using geoloco::Error::Error;
};

// A peer was refused (or refused us) during the handshake: version, run id, config hash,
// lane layout or key mismatch.
class HandshakeError : public TransportError {
 public:
  using TransportError::TransportError;
};

// A frame failed validation (magic, version, kind, round, shard, offset, length, total,
// checksum, duplicate). The recv it was aimed at fails with this error.
class FrameError : public TransportError {
 public:
  using TransportError::TransportError;
};

// An operation did not finish before its deadline.
class TimeoutError : public TransportError {
 public:
  using TransportError::TransportError;
};

// Throws TransportError("<what>: <ucs status string>") unless status is UCS_OK (or
// UCS_INPROGRESS, which is not a failure). `what` carries the context.
void check_ucs(ucs_status_t status, const std::string& what);

}  // namespace geoloco::transport
