// What the small quality grid showed about H and the outer learning rate (docs/quality.md,
// bench/quality/results/tune.json: DiLoCo, 4 sites, AdamW inside, Nesterov momentum 0.9, one
// seed): the loss grows with H (2.01 at H 10, 2.08 at 25, 2.12 at 50, 2.33 at 100, each at its
// best outer lr), and a large outer lr at a small H breaks the run (lr 1.0 at H 10: 2.92,
// against 2.01 at lr 0.7). So the planner may go below H 25 only when the outer step is gentle
// enough, and keeps 25 as the floor above that lr. Used by outer.plan: auto (the floor of its
// H search) and geoloco validate (a note on a manual schedule).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace geoloco::planner {

// The largest outer (Nesterov / SGD) lr the grid found safe at every H it measured.
inline constexpr double kSafeOuterLrAtSmallH = 0.7;
// Below this H an outer lr above kSafeOuterLrAtSmallH measured much worse.
inline constexpr int64_t kLargeLrHFloor = 25;

// The smallest H worth planning for an outer step of this kind and lr, given the configured
// floor (outer.plan_h_min): the configured floor, raised to kLargeLrHFloor when the outer lr
// is above kSafeOuterLrAtSmallH (sparseloco and adam are not covered by the grid: unchanged).
int64_t quality_h_floor(int64_t configured, const std::string& outer_kind, double outer_lr);

// A note for a manual schedule of H inner steps with this outer step, when the grid says it
// risks quality; nullopt when it does not.
std::optional<std::string> outer_lr_note(const std::string& outer_kind, double outer_lr, int64_t H);

}  // namespace geoloco::planner
