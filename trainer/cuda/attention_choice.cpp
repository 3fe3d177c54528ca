#include "trainer/cuda/attention_choice.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace geoloco::cuda {

AttentionKernel parse_attention_kernel(std::string_view s) {
  if (s == "auto") return AttentionKernel::Auto;
  if (s == "fused") return AttentionKernel::Fused;
  if (s == "materialized") return AttentionKernel::Materialized;
  throw ConfigError(fmt::format("attention '{}' is not supported: choose auto, fused or materialized", s));
}

const char* attention_kernel_name(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::Auto: return "auto";
    case AttentionKernel::Fused: return "fused";
    case AttentionKernel::Materialized: return "materialized";
  }
  return "?";
}

bool fused_attention_fits(int n_embd, int n_head) {
  if (n_head <= 0 || n_embd % n_head != 0) return false;
  const int hs = n_embd / n_head;
  return hs % 16 == 0 && hs <= kFusedMaxHeadSize;
}

std::string fused_attention_refusal(Precision p, int n_embd, int n_head) {
  if (p != Precision::Bf16) return "the fused attention runs in bf16 only (train.precision: bf16)";
  if (!fused_attention_fits(n_embd, n_head))
    return fmt::format(
        "the fused attention needs a head size (n_embd / n_head = {} / {}) that is a multiple of 16 "
        "and at most {}",
        n_embd, n_head, kFusedMaxHeadSize);
  return "";
}

int64_t materialized_attention_bytes(int n_layer, int n_head, int64_t B, int64_t T, int act_bytes) {
  const int64_t scores = B * n_head * T * T;
  return scores * act_bytes * n_layer + scores * (4 + act_bytes);
}

bool uses_fused_attention(AttentionKernel k, Precision p, int n_embd, int n_head, int64_t materialized_bytes,
                          int64_t free_bytes) {
  if (k == AttentionKernel::Materialized) return false;
  const std::string why = fused_attention_refusal(p, n_embd, n_head);
  if (k == AttentionKernel::Fused && !why.empty()) throw ConfigError(why);
  if (k == AttentionKernel::Auto && materialized_bytes > 0 && materialized_bytes <= free_bytes / 2) return false;
  return why.empty();
}

}  // namespace geoloco::cuda
