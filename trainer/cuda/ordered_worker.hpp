// OrderedWorker: one background thread that runs posted tasks strictly in posting order.
// Used to issue gradient collectives while the backward pass keeps enqueuing work: every
// rank must call its collectives in the same order, and one thread keeps that order.
// The first task that throws stops the rest (they are skipped: a collective after a failed
// one would hang or mismatch); wait() rethrows that exception.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace geoloco::cuda {

class OrderedWorker {
 public:
  OrderedWorker();
  ~OrderedWorker();  // finishes queued tasks (errors are dropped), then joins
  OrderedWorker(const OrderedWorker&) = delete;
  OrderedWorker& operator=(const OrderedWorker&) = delete;

  void post(std::function<void()> task);
  // Blocks until every posted task has run (or been skipped after a failure); rethrows the
  // first failure once and then clears it, so the worker can be reused for the next step.
  void wait();

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  int running_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace geoloco::cuda
