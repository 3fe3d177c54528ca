// NativeSite: the native trainer's side of the outer loop's seam (outer_optimizer/site.hpp) --
// a site strategy's shard and collectives, the rank's trace, plan.json in the run's output.
#pragma once

#include <string>

#include "outer_optimizer/site.hpp"
#include "trainer/loop/site_strategy.hpp"

namespace geoloco::trainer {

class NativeSite final : public outer::Site {
 public:
  // `strategy` and `trace` outlive this; plans go to `<output_dir>/plan.json`.
  NativeSite(SiteStrategy& strategy, TraceRecorder* trace, std::string output_dir);

  int rank() const override { return strategy_.rank(); }
  int ranks() const override { return strategy_.ranks(); }
  ShardRange shard() const override { return strategy_.shard(); }
  std::span<float> shard_params() override { return strategy_.shard_params(); }
  void shard_updated() override { strategy_.shard_updated(); }
  outer::DeviceOuter* device() override { return strategy_.device_outer(); }
  // The inner optimizer's moments (a device strategy's proxy applies it on the device).
  void reset_inner_state() override { strategy_.optimizer().reset(); }
  std::vector<std::vector<std::byte>> all_gather(std::span<const std::byte> mine) override;
  void sum(std::span<double> values) override { strategy_.site_sum(values); }
  TraceRecorder* trace() override { return trace_; }
  void write_plans(const nlohmann::json& plans) override;

 private:
  SiteStrategy& strategy_;
  TraceRecorder* trace_;
  std::string output_dir_;
};

// The model's named tensors as the outer loop cuts fragments from them.
outer::ModelParams model_params(const ParamLayout& layout);

}  // namespace geoloco::trainer
