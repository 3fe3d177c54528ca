// Failure paths: handshake refusals, garbage on the port, tampered frames, dead peers,
// missing peers.
#include <gtest/gtest.h>

#include "tests/transport/test_util.hpp"

using namespace geoloco::transport;
using namespace geoloco::transport::test;
