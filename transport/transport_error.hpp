// geoloco::transport errors. All are run-time failures (geoloco::Error, CLI exit 1): a peer
// died, timed out, was refused at the handshake or sent a malformed frame, or the caller
// cancelled the operation. Messages always name the peer (site/rank host:port) and the
// operation; the key bytes are never included.
#pragma once

#include <string>

#include "core/error.hpp"

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

// The caller cancelled the operation (OpHandle::cancel, Transport::cancel) before it
// completed; the peer may be perfectly healthy.
class CancelledError : public TransportError {
 public:
  using TransportError::TransportError;
};

}  // namespace geoloco::transport
