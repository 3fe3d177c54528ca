#include "trainer/cuda/ordered_worker.hpp"

#include <utility>

namespace geoloco::cuda {

OrderedWorker::OrderedWorker() : thread_([this] { loop(); }) {}

OrderedWorker::~OrderedWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void OrderedWorker::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_all();
}

void OrderedWorker::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return queue_.empty() && running_ == 0; });
  if (error_) {
    std::exception_ptr e = std::exchange(error_, nullptr);
    std::rethrow_exception(e);
  }
}

void OrderedWorker::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop requested and nothing left
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    if (error_) {
      cv_.notify_all();
      continue;  // skipped: an earlier task failed
    }
    ++running_;
    lock.unlock();
    std::exception_ptr failed;
    try {
      task();
    } catch (...) {
      failed = std::current_exception();
    }
    lock.lock();
    --running_;
    if (failed && !error_) error_ = failed;
    cv_.notify_all();
  }
}

}  // namespace geoloco::cuda
