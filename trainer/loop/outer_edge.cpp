// The outer loop's options from a run's config (outer_edge.hpp).
#include "trainer/loop/outer_edge.hpp"

#include "trainer/loop/native_site.hpp"
#include "trainer/model/param_layout.hpp"

namespace geoloco::trainer {

std::vector<outer::SiteSpec> outer_sites(const RunConfig& cfg) {
  std::vector<outer::SiteSpec> sites;
  for (const auto& s : cfg.sites) sites.push_back({s.name, s.ranks});
  return sites;
}

outer::OuterOptions outer_options(const RunConfig& cfg, int site, int rank, outer::OuterHooks hooks, bool joining) {
  outer::OuterOptions o;
  o.sites = outer_sites(cfg);
  o.site = site;
  o.rank = rank;
  o.outer = cfg.outer;
  o.params = model_params(ParamLayout(cfg.model));
  o.total_steps = cfg.train.steps;
  o.checkpoint_every = cfg.train.checkpoint_every;
  o.tokens_per_step = static_cast<uint64_t>(cfg.site_batch(site)) * static_cast<uint64_t>(cfg.seq_len());
  o.config_hash = cfg.hash;
  o.init_from = cfg.train.init_from;
  if (cfg.transport) {
    o.eager_bytes = cfg.transport->eager_bytes;
    o.emulated_link = cfg.transport->emulate.enabled();
  }
  o.hooks = std::move(hooks);
  o.joining = joining;
  return o;
}

}  // namespace geoloco::trainer
