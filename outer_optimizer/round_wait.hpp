// Waiting on a round's transport operations until its deadline, and cancelling what a failed
// round leaves behind (round_sync.cpp, owner_exchange.cpp).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "transport/op.hpp"
#include "transport/transport_error.hpp"

namespace geoloco::outer {

// Operations a failed round leaves behind are cancelled, not waited for: they own their
// buffers, and the peers' deadlines are theirs to keep.
struct CancelOnExit {
  std::vector<transport::OpHandle>& ops;
  ~CancelOnExit() {
    for (auto& op : ops) op.cancel();
  }
};

// Waits for `op` until `deadline`; "" when it succeeded, else why not (the op is cancelled).
inline std::string await_op(transport::OpHandle& op, std::chrono::steady_clock::time_point deadline,
                            double deadline_s) {
  try {
    const auto left =
        std::max(std::chrono::steady_clock::duration::zero(), deadline - std::chrono::steady_clock::now());
    if (op.wait_for(left)) return "";
    op.cancel();
    return fmt::format("no contribution within the round's deadline ({:.3g} s)", deadline_s);
  } catch (const transport::TransportError& e) {
    return e.what();
  }
}

}  // namespace geoloco::outer
