#include "trainer/cuda/staging.hpp"

#include <cstring>

namespace geoloco::cuda {

HostStager::HostStager(size_t capacity) : buf_(capacity, "pseudo-gradient staging"), copy_("pseudo-gradient copy") {}

void HostStager::download_async(std::span<const float> device, cudaStream_t after) {
  GEOLOCO_CHECK(device.size() <= buf_.size(), "staging {} floats into a pinned buffer of {}", device.size(),
                buf_.size());
  ordered_.record(after);
  ordered_.make_wait(copy_.get());
  if (!device.empty())
    check_cuda(cudaMemcpyAsync(buf_.data(), device.data(), device.size() * sizeof(float), cudaMemcpyDeviceToHost,
                               copy_.get()),
               fmt::format("stage {} floats device -> pinned host", device.size()));
  done_.record(copy_.get());
  last_ = device.size();
  pending_ = true;
}

bool HostStager::ready() const {
  if (!pending_) return true;
  const cudaError_t e = cudaEventQuery(done_.get());
  if (e == cudaErrorNotReady) return false;
  check_cuda(e, "staging query");
  return true;
}

std::span<const float> HostStager::wait() {
  if (pending_) done_.synchronize();
  pending_ = false;
  return {buf_.data(), last_};
}

void HostStager::upload_async(std::span<const float> host, std::span<float> device, cudaStream_t before) {
  GEOLOCO_CHECK(host.size() == device.size() && host.size() <= buf_.size(),
                "upload of {} floats to a device span of {} (pinned capacity {})", host.size(), device.size(),
                buf_.size());
  // The pinned buffer may still be the source or target of the previous transfer.
  if (pending_) done_.synchronize();
  if (host.data() != buf_.data()) std::memcpy(buf_.data(), host.data(), host.size() * sizeof(float));
  if (!host.empty())
    check_cuda(cudaMemcpyAsync(device.data(), buf_.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice,
                               copy_.get()),
               fmt::format("upload {} floats pinned host -> device", host.size()));
  done_.record(copy_.get());
  done_.make_wait(before);
  last_ = 0;
  pending_ = true;
}

}  // namespace geoloco::cuda
