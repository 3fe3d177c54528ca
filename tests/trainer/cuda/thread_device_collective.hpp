// A device-memory Collective for ranks that are threads sharing one GPU (test only): NCCL
// refuses two ranks of one communicator on the same device, and the GPU check machine has one
// H200, so the 2-rank site tests use this instead. Every call stages the caller's device span
// to the host on its own stream, meets the other ranks at a barrier, reduces in rank order on
// the host (every rank computes the same bits), and copies the result back. Deterministic,
// slow, correct: it exercises the device strategies' calls and their stream ordering (a
// gradient read before the model stream finished shows up as a wrong sum).
#pragma once

#include <cuda_runtime_api.h>

#include <barrier>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "trainer/cuda/handles.hpp"
#include "trainer/parallel/collective.hpp"
#include "core/shard.hpp"

namespace geoloco::cuda::testing {

struct ThreadBoard {
  explicit ThreadBoard(int n) : ranks(n), sync(n), slots(static_cast<size_t>(n)) {}
  int ranks;
  std::barrier<> sync;
  std::vector<std::vector<std::byte>> slots;  // each rank's staged input
  // Subgroups split from this board, by (split call, color): the first member creates it.
  std::mutex mu;
  std::map<std::pair<int, int>, std::shared_ptr<ThreadBoard>> splits;
};

class ThreadDeviceCollective final : public parallel::Collective {
 public:
  ThreadDeviceCollective(std::shared_ptr<ThreadBoard> board, int rank, std::string site)
      : board_(std::move(board)), rank_(rank), site_(std::move(site)), stream_("thread collective") {}

  int rank() const override { return rank_; }
  int size() const override { return board_->ranks; }
  const std::string& site() const override { return site_; }
  const char* backend() const override { return "thread-device"; }
  parallel::MemorySpace memory() const override { return parallel::MemorySpace::kCuda; }

  void all_reduce_sum(std::span<float> d) override { all_reduce(d); }
  void all_reduce_sum(std::span<double> d) override { all_reduce(d); }
  void all_reduce_sum(std::span<uint64_t> d) override { all_reduce(d); }

  void reduce_scatter_sum(std::span<const float> in, std::span<float> out) override {
    publish(in);
    const auto sh = geoloco::shard_of(static_cast<int64_t>(in.size()), rank_, size());
    std::vector<float> sum(static_cast<size_t>(sh.count), 0.0f);
    for (int r = 0; r < size(); ++r) {
      const float* src = reinterpret_cast<const float*>(board_->slots[size_t(r)].data()) + sh.offset;
      for (size_t i = 0; i < sum.size(); ++i) sum[i] = r == 0 ? src[i] : sum[i] + src[i];
    }
    board_->sync.arrive_and_wait();
    to_device(out.data(), sum.data(), sum.size() * sizeof(float));
  }

  void all_gather(std::span<const float> mine, std::span<float> out) override {
    publish(mine);
    std::vector<float> full(out.size());
    for (int r = 0; r < size(); ++r) {
      const auto sh = geoloco::shard_of(static_cast<int64_t>(out.size()), r, size());
      std::memcpy(full.data() + sh.offset, board_->slots[size_t(r)].data(), size_t(sh.count) * sizeof(float));
    }
    board_->sync.arrive_and_wait();
    to_device(out.data(), full.data(), full.size() * sizeof(float));
  }

  void broadcast(std::span<float> d, int root) override {
    publish(std::span<const float>(d));
    std::vector<std::byte> v = board_->slots[size_t(root)];
    board_->sync.arrive_and_wait();
    to_device(d.data(), v.data(), v.size());
  }

  void barrier() override { board_->sync.arrive_and_wait(); }

  std::vector<std::vector<std::byte>> all_gather_bytes(std::span<const std::byte> mine) override {
    board_->slots[size_t(rank_)].assign(mine.begin(), mine.end());
    board_->sync.arrive_and_wait();
    auto all = board_->slots;
    board_->sync.arrive_and_wait();
    return all;
  }

  std::unique_ptr<parallel::Collective> split(int color, int key, const std::string& label) override {
    const parallel::SplitMembers m = parallel::split_members(*this, color, key);
    std::shared_ptr<ThreadBoard> sub;
    {
      std::lock_guard<std::mutex> lock(board_->mu);
      auto& slot = board_->splits[{splits_, color}];
      if (!slot) slot = std::make_shared<ThreadBoard>(static_cast<int>(m.parent_ranks.size()));
      sub = slot;
    }
    ++splits_;
    return std::make_unique<ThreadDeviceCollective>(sub, m.index, site_ + " " + label);
  }

 private:
  template <class T>
  void publish(std::span<const T> d) {
    auto& slot = board_->slots[size_t(rank_)];
    slot.resize(d.size_bytes());
    if (!d.empty()) {
      check_cuda(cudaMemcpyAsync(slot.data(), d.data(), d.size_bytes(), cudaMemcpyDeviceToHost, stream_.get()),
                 "thread collective: stage to host");
      check_cuda(cudaStreamSynchronize(stream_.get()), "thread collective: stage to host");
    }
    board_->sync.arrive_and_wait();
  }
  void to_device(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_.get()), "thread collective: result");
    check_cuda(cudaStreamSynchronize(stream_.get()), "thread collective: result");
  }
  template <class T>
  void all_reduce(std::span<T> d) {
    publish(std::span<const T>(d));
    std::vector<T> sum(d.size());
    for (int r = 0; r < size(); ++r) {
      const T* src = reinterpret_cast<const T*>(board_->slots[size_t(r)].data());
      for (size_t i = 0; i < sum.size(); ++i) sum[i] = r == 0 ? src[i] : sum[i] + src[i];
    }
    board_->sync.arrive_and_wait();
    to_device(d.data(), sum.data(), d.size_bytes());
  }

  std::shared_ptr<ThreadBoard> board_;
  int splits_ = 0;
  int rank_;
  std::string site_;
  Stream stream_;
};

}  // namespace geoloco::cuda::testing
