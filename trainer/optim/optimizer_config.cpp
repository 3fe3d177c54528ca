#include "trainer/optim/optimizer_config.hpp"

#include <vector>

namespace geoloco::trainer {

const char* optimizer_kind_name(OptimizerKind k) { return k == OptimizerKind::Muon ? "muon" : "adamw"; }

double OptimizerConfig::muon_lr(double scheduled) const { return lr > 0 ? scheduled * (muon.lr / lr) : 0.0; }

OptimizerConfig OptimizerConfig::from_yaml(const config::Node& n) {
  OptimizerConfig c;
  const std::string kind = n.get_choice("kind", "adamw", {"adamw", "muon"});
  c.kind = kind == "muon" ? OptimizerKind::Muon : OptimizerKind::AdamW;
  c.lr = n.get_double("lr", c.lr, 0.0, 10.0);
  if (n.has("betas")) {
    auto b = n.get<std::vector<double>>("betas", {});
    if (b.size() != 2 || !(b[0] >= 0 && b[0] < 1) || !(b[1] >= 0 && b[1] < 1))
      n.fail_value("betas", "a list of two numbers in [0, 1), e.g. [0.9, 0.95]");
    c.beta1 = b[0];
    c.beta2 = b[1];
  }
  c.eps = n.get_double("eps", c.eps, 0.0, 1.0);
  c.weight_decay = n.get_double("weight_decay", c.weight_decay, 0.0, 10.0);
  if (n.has("muon")) {
    if (c.kind != OptimizerKind::Muon) n.fail("muon", "Muon's settings need `kind: muon` (this optimizer is adamw)");
    const auto m = n.child("muon");
    c.muon.lr = m.get_double("lr", c.muon.lr, 1e-9, 10.0);
    c.muon.momentum = m.get_double("momentum", c.muon.momentum, 0.0, 0.9999);
    c.muon.nesterov = m.get<bool>("nesterov", c.muon.nesterov);
    c.muon.ns_steps = static_cast<int>(m.get_int("ns_steps", c.muon.ns_steps, 1, 20));
    const std::string scale = m.get_choice("scale", "spectral", {"spectral", "rms"});
    c.muon.scale = scale == "rms" ? MuonScale::Rms : MuonScale::Spectral;
    m.finish();
  }
  n.finish();
  return c;
}

}  // namespace geoloco::trainer
