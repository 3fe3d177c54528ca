// A run's YAML into RunConfig: every section parsed by its component, then the checks that
// span sections (sites against the model, the outer loop against the sites, GPUs) (run_config.hpp).
#include "trainer/loop/run_config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string_view>

#include "trainer/checkpoint/model_checkpoint.hpp"
#include "core/hash.hpp"
#include "trainer/cuda/attention_choice.hpp"
#include "trainer/loop/device_site.hpp"
#include "trainer/loop/strategy_choice.hpp"
#include "planner/topology.hpp"

namespace geoloco::trainer {

TrainConfig TrainConfig::from_yaml(const config::Node& n) {
  TrainConfig c;
  constexpr int64_t kBig = int64_t{1} << 40;
  c.steps = n.get_int("steps", c.steps, 1, kBig);
  c.micro_batch = static_cast<int>(n.get_int("micro_batch", c.micro_batch, 1, 1 << 20));
  c.grad_accum = static_cast<int>(n.get_int("grad_accum", c.grad_accum, 1, 1 << 20));
  c.seq_len = static_cast<int>(n.get_int("seq_len", c.seq_len, 0, 1 << 20));
  c.optimizer = OptimizerConfig::from_yaml(n.child("optimizer"));
  c.schedule = ScheduleConfig::from_yaml(n.child("schedule"));
  {
    auto s = n.child("lr_scaling");
    c.lr_scaling.kind = s.get_choice("kind", c.lr_scaling.kind, {"none", "linear"});
    c.lr_scaling.base_batch = s.get_int("base_batch", 0, 0, kBig);
    if (c.lr_scaling.kind == "linear" && c.lr_scaling.base_batch == 0)
      s.fail("base_batch", "missing: linear scaling needs the batch (in sequences) that lr was tuned for");
    s.finish();
  }
  c.grad_clip = n.get_double("grad_clip", c.grad_clip, 0.0, 1e9);
  c.precision = n.get_choice("precision", c.precision, {"fp32", "bf16"});
  c.attention = n.get_choice("attention", c.attention, {"auto", "fused", "materialized"});
  c.threads = static_cast<int>(n.get_int("threads", c.threads, 1, 1024));
  c.log_every = n.get_int("log_every", c.log_every, 1, kBig);
  c.eval_every = n.get_int("eval_every", c.eval_every, 0, kBig);
  c.eval_batches = static_cast<int>(n.get_int("eval_batches", c.eval_batches, 1, 1 << 20));
  c.checkpoint_every = n.get_int("checkpoint_every", c.checkpoint_every, 0, kBig);
  c.keep_checkpoints = static_cast<int>(n.get_int("keep_checkpoints", c.keep_checkpoints, 1, 1000));
  c.init_from = n.get<std::string>("init_from", c.init_from);
  if (n.has("rehearsal")) c.rehearsal = RehearsalConfig::from_yaml(n.child("rehearsal"));
  n.finish();
  return c;
}

int RunConfig::world_size() const {
  int w = 0;
  for (const auto& s : sites) w += s.ranks;
  return w;
}

int RunConfig::global_rank(int site, int rank) const {
  int g = 0;
  for (int i = 0; i < site; ++i) g += sites[static_cast<size_t>(i)].ranks;
  return g + rank;
}

int RunConfig::site_index(const std::string& name) const {
  for (size_t i = 0; i < sites.size(); ++i)
    if (sites[i].name == name) return static_cast<int>(i);
  return -1;
}

int64_t RunConfig::global_batch() const {
  int64_t b = 0;
  for (size_t s = 0; s < sites.size(); ++s) b += site_batch(static_cast<int>(s));
  return b;
}

int64_t RunConfig::site_batch(int site) const {
  const auto& s = sites.at(static_cast<size_t>(site));
  return int64_t(train.micro_batch) * s.grad_accum * s.ranks;
}

double RunConfig::peak_lr() const {
  double lr = train.optimizer.lr;
  if (train.lr_scaling.kind == "linear") {
    // Every site is one data-parallel replica: its effective batch is what its optimizer sees.
    lr *= static_cast<double>(site_batch(0)) / static_cast<double>(train.lr_scaling.base_batch);
  }
  return lr;
}

namespace {

constexpr const char* kBuiltWithoutCuda =
    "cuda, but this geoloco binary was built without CUDA (configure with -DGEOLOCO_CUDA=ON on a machine with nvcc "
    "and NCCL), or use device: cpu";

// strategy, group_size and topology of `site:` (defaults) or of one `sites[i]`, over `s`'s values.
void read_strategy(const config::Node& n, SiteConfig& s) {
  s.strategy = n.get_choice("strategy", s.strategy_auto ? "auto" : s.strategy,
                            {"ddp", "zero1", "zero2", "fsdp", "hybrid", "auto"});
  s.strategy_auto = s.strategy == "auto";
  if (n.has("group_size")) s.group_size = static_cast<int>(n.get_int("group_size", 1, 1, 4096));
  if (n.has("topology")) {
    auto t = n.child("topology");
    s.topology.file = t.get<std::string>("file", s.topology.file);
    s.topology.gpu_tflops = t.get_double("gpu_tflops", s.topology.gpu_tflops, 1e-3, 1e6);
    s.topology.gpu_memory_gb = t.get_double("gpu_memory_gb", s.topology.gpu_memory_gb, 1e-3, 1e6);
    s.topology.activations_gb = t.get_double("activations_gb", s.topology.activations_gb, 0, 1e6);
    s.topology.nodes = static_cast<int>(t.get_int("nodes", s.topology.nodes, 1, 1024));
    s.topology.node_link_gbs = t.get_double("node_link_gbs", s.topology.node_link_gbs, 1e-3, 1e6);
    s.topology.node_link_latency_us = t.get_double("node_link_latency_us", s.topology.node_link_latency_us, 0, 1e6);
    t.finish();
  }
}

// The strategy keys of one site once its ranks and device are known.
void check_strategy(const config::Node& n, const SiteConfig& s) {
  if (s.strategy == "hybrid") {
    if (s.group_size == 0)
      n.fail("group_size", "strategy: hybrid needs group_size (ranks per group: sharded inside, replicated across)");
    if (s.ranks % s.group_size != 0)
      n.fail("group_size", fmt::format("got {}, which does not divide the site's {} ranks", s.group_size, s.ranks));
  }
  if (s.strategy_auto && s.topology.file.empty() && s.device != "cuda")
    n.fail("topology",
           "strategy: auto on a cpu site needs topology.file (the text of nvidia-smi topo -m, or a topology YAML); "
           "a cuda site without one reads nvidia-smi topo -m at start");
}

std::vector<SiteConfig> parse_sites(const config::Node& root) {
  auto defaults = root.child("site");
  SiteConfig d;
  read_strategy(defaults, d);
  d.device = defaults.get_choice("device", d.device, {"cpu", "cuda"});
  if (d.device == "cuda" && !built_with_cuda()) defaults.fail("device", kBuiltWithoutCuda);
  defaults.finish();

  std::vector<SiteConfig> sites;
  std::set<std::string> names;
  std::set<std::pair<std::string, int>> ports;
  auto items = root.items("sites");
  if (items.empty()) {
    // A single local site: the one-process (or one-site) run.
    SiteConfig s = d;
    s.name = "local";
    check_strategy(defaults, s);
    sites.push_back(s);
    return sites;
  }
  for (const auto& n : items) {
    SiteConfig s = d;
    s.name = n.require<std::string>("name");
    if (s.name.empty() || s.name.find_first_of("/ \t") != std::string::npos)
      n.fail_value("name", "a non-empty name without spaces or '/'");
    if (!names.insert(s.name).second) n.fail("name", fmt::format("duplicate site name '{}'", s.name));
    s.ranks = static_cast<int>(n.get_int("ranks", 1, 1, 4096));
    s.host = n.get<std::string>("host", s.host);
    if (s.host.empty()) n.fail_value("host", "an IP address or host name");
    s.hosts = n.get<std::vector<std::string>>("hosts", {});
    if (!s.hosts.empty()) {
      if (static_cast<int>(s.hosts.size()) != s.ranks)
        n.fail("hosts", fmt::format("got {} addresses for {} ranks: give one per rank (rank r listens on hosts[r])",
                                    s.hosts.size(), s.ranks));
      if (n.has("host")) n.fail("host", "give either host (every rank) or hosts (one per rank), not both");
      s.host = s.hosts[0];
    }
    s.nodes = static_cast<int>(n.get_int("nodes", 1, 1, s.ranks));
    if (s.nodes > 1) {
      if (!s.hosts.empty())
        n.fail("nodes", "give either nodes (its ranks find their own addresses) or hosts (one per rank), not both");
      if (s.ranks % s.nodes != 0)
        n.fail("nodes", fmt::format("{} ranks do not split evenly over {} nodes", s.ranks, s.nodes));
    }
    s.port = static_cast<int>(n.get_int("port", s.port, 1024, 65535));
    if (s.port + s.ranks > 65535) n.fail("port", fmt::format("port {} + {} ranks exceeds 65535", s.port, s.ranks));
    // Rank r uses port + r; the site's rendezvous uses port + ranks.
    for (int r = 0; r <= s.ranks; ++r) {
      if (!ports.insert({r < s.ranks ? s.node_key(r) : s.host, s.port + r}).second)
        n.fail("port",
               fmt::format("port range {}..{} on {} overlaps another site's", s.port, s.port + s.ranks, s.host));
    }
    read_strategy(n, s);
    // A site over several nodes (nodes, or distinct hosts) is that many nodes of its topology
    // for strategy: auto's model; topology.nodes may only repeat it.
    if (const int k = s.node_count(); k > 1) {
      if (s.topology.nodes != 1 && s.topology.nodes != k)
        n.fail("topology", fmt::format("topology.nodes is {}, but the site's ranks are on {} nodes ({})",
                                       s.topology.nodes, k, s.hosts.empty() ? "nodes" : "hosts"));
      s.topology.nodes = k;
    }
    s.device = n.get_choice("device", d.device, {"cpu", "cuda"});
    if (s.device == "cuda" && !built_with_cuda()) n.fail("device", kBuiltWithoutCuda);
    // A smaller site may accumulate more micro-batches to train as many tokens per step.
    s.grad_accum = n.has("grad_accum") ? static_cast<int>(n.get_int("grad_accum", 1, 1, 1 << 20)) : 0;
    s.slowdown = n.get_double("slowdown", 1.0, 1.0, 1000.0);
    check_strategy(n, s);
    n.finish();
    sites.push_back(s);
  }
  return sites;
}

// train.init_from: the model file it names, opened (checksums verified) and checked against
// the model now, so `geoloco validate` and every rank refuse a wrong file before any work.
std::string resolve_init_from(const config::Node& train, const std::string& value, const std::string& dir,
                              const ModelConfig& model) {
  std::filesystem::path p(value);
  if (p.is_relative()) p = std::filesystem::path(dir) / p;
  try {
    const std::string file = find_model_file(p.lexically_normal().string());
    check_model(SafetensorsFile::read(file), ParamLayout(model));
    return file;
  } catch (const FileError& e) {
    train.fail("init_from", e.what());
  }
}

}  // namespace

RunConfig parse_run_config(const config::Document& doc) {
  RunConfig c;
  c.path = doc.source->file;
  c.dir = std::filesystem::path(c.path).parent_path().string();
  if (c.dir.empty()) c.dir = ".";
  auto root = doc.node();

  {
    auto r = root.child("run");
    c.run.name = r.get<std::string>("name", c.run.name);
    if (c.run.name.empty() || c.run.name.find('/') != std::string::npos)
      r.fail_value("name", "a non-empty name without '/'");
    c.run.seed = r.get<uint64_t>("seed", c.run.seed);
    c.run.output_dir = r.get<std::string>("output_dir", "runs/" + c.run.name);
    c.run.log_level = r.get_choice("log_level", c.run.log_level, {"debug", "info", "warn", "error"});
    c.run.metrics_port = static_cast<int>(r.get_int("metrics_port", 0, 0, 65535));
    c.run.metrics_host = r.get<std::string>("metrics_host", c.run.metrics_host);
    if (c.run.metrics_host.empty())
      r.fail_value("metrics_host", "an address of this machine (e.g. 127.0.0.1, 0.0.0.0)");
    c.run.command = r.get<std::vector<std::string>>("command", {});
    if (r.has("command") && c.run.command.empty())
      r.fail_value("command", "a non-empty list: the program each rank runs, e.g. [python3, train.py]");
    for (const auto& arg : c.run.command)
      if (arg.empty()) r.fail_value("command", "a list of non-empty arguments");
    r.finish();
  }
  if (c.external_inner_loop()) {
    // The program's own inner loop: its model and data are its own, and of train: only what
    // the outer loop and the records need.
    for (const char* key : {"model", "data"})
      if (root.has(key))
        root.fail(key, "not read with run.command: the model and data are the program's own (remove this section)");
    auto t = root.child("train");
    constexpr int64_t kBig = int64_t{1} << 40;
    c.train.steps = t.get_int("steps", c.train.steps, 1, kBig);
    c.train.checkpoint_every = t.get_int("checkpoint_every", 0, 0, kBig);
    c.train.keep_checkpoints = static_cast<int>(t.get_int("keep_checkpoints", c.train.keep_checkpoints, 1, 1000));
    c.train.log_every = t.get_int("log_every", c.train.log_every, 1, kBig);
    t.finish();  // any other train: key is the program's (its optimizer, batch, schedule)
  } else {
    c.model = ModelConfig::from_yaml(root.child("model"));
    c.data = DataConfig::from_yaml(root.child("data"));
    c.train = TrainConfig::from_yaml(root.child("train"));
  }
  if (c.train.seq_len > c.model.block_size)
    root.child("train").fail(
        "seq_len", fmt::format("got {}, expected at most model.block_size ({})", c.train.seq_len, c.model.block_size));
  if (!c.train.init_from.empty())
    c.train.init_from = resolve_init_from(root.child("train"), c.train.init_from, c.dir, c.model);
  c.sites = parse_sites(root);
  for (auto& s : c.sites)
    if (s.grad_accum == 0) s.grad_accum = c.train.grad_accum;
  // strategy: auto -- chosen now from the topology file, the same on every rank of every site.
  {
    auto items = root.items("sites");
    for (size_t i = 0; i < c.sites.size(); ++i) {
      auto& s = c.sites[i];
      if (!s.strategy_auto || s.topology.file.empty()) continue;  // no file: the host's, at start
      const config::Node where = items.empty() ? root.child("site") : items[i];
      std::filesystem::path file(s.topology.file);
      if (file.is_relative()) file = std::filesystem::path(c.dir) / file;
      s.topology.file = file.lexically_normal().string();
      try {
        const StrategyChoice ch = choose_strategy(c, static_cast<int>(i), planner::load_topology_file(s.topology.file));
        s.strategy = ch.strategy;
        s.group_size = ch.group_size;
        s.strategy_reason = ch.reason;
      } catch (const InputError& e) {
        where.fail("topology", e.what());
      }
    }
  }
  if (c.run.metrics_port > 0 && c.run.metrics_port + c.world_size() - 1 > 65535)
    root.child("run").fail("metrics_port",
                           fmt::format("got {}, but rank g serves on metrics_port + g and the run has {} ranks: "
                                       "expected at most {}",
                                       c.run.metrics_port, c.world_size(), 65536 - c.world_size()));
  if (c.train.precision == "bf16")
    for (const auto& s : c.sites)
      if (s.device != "cuda")
        root.child("train").fail("precision", fmt::format("bf16 needs site.device: cuda, but site '{}' runs on the "
                                                          "CPU (the CPU path is fp32)",
                                                          s.name));
  if (c.train.rehearsal.enabled)
    for (const auto& s : c.sites)
      if (s.device != "cpu")
        root.child("train").fail("rehearsal",
                                 fmt::format("a rehearsal's stand-in inner loop runs on the host, but site '{}' has "
                                             "device: {} (rehearse with device: cpu)",
                                             s.name, s.device));
  if (c.train.attention == "fused") {
    const std::string why =
        cuda::fused_attention_refusal(cuda::parse_precision(c.train.precision), c.model.n_embd, c.model.n_head);
    if (!why.empty()) root.child("train").fail("attention", "fused: " + why);
  }
  if (root.has("outer") || c.sites.size() > 1) c.outer = outer::OuterConfig::from_yaml(root.child("outer"));
  // (With run.command the program names its fragments: the Python package checks them.)
  if (!c.external_inner_loop() && c.outer.fragments > c.model.n_layer)
    root.child("outer").fail("fragments",
                             fmt::format("got {}, but the model has {} transformer blocks (a fragment holds "
                                         "at least one block)",
                                         c.outer.fragments, c.model.n_layer));
  if (c.outer.min_sites > static_cast<int>(c.sites.size()))
    root.child("outer").fail("min_sites",
                             fmt::format("got {}, but the config has {} site(s)", c.outer.min_sites, c.sites.size()));
  if ((c.outer.owner_exchange() || c.outer.exchange_auto()) &&
      c.outer.quorum(static_cast<int>(c.sites.size())) < static_cast<int>(c.sites.size()))
    root.child("outer").fail(
        "exchange",
        fmt::format("{} needs every site in every round (a site lost between its two phases would "
                    "leave its slice's average with nobody): set outer.min_sites: {} (now {})",
                    outer::name(c.outer.exchange), c.sites.size(), c.outer.quorum(static_cast<int>(c.sites.size()))));
  if (c.outer.quantize_on == outer::QuantizeOn::Device &&
      std::none_of(c.sites.begin(), c.sites.end(), [](const SiteConfig& s) { return s.device == "cuda"; }))
    root.child("outer").fail("quantize_on",
                             "device quantizes on a GPU site's device, and no site has device: cuda: set "
                             "quantize_on: auto | host");
  if (c.sites.size() > 64) root.fail("sites", fmt::format("{} sites: at most 64", c.sites.size()));
  if (root.has("transport")) c.transport = transport::TransportConfig::from_yaml(root.child("transport"), c.dir);
  if (c.sites.size() > 1) {
    if (!c.transport)
      root.fail("transport", "missing: a multi-site run needs a transport section with psk_file (the pre-shared key)");
  }
  root.finish();

  YAML::Emitter out;
  out << doc.root;
  c.hash = hash64(std::string_view(out.c_str(), out.size()));
  c.canonical_yaml.assign(out.c_str(), out.size());
  return c;
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  return parse_run_config(config::load_file(path, overrides));
}

int SiteConfig::node_count() const {
  if (hosts.empty()) return nodes;
  std::set<std::string_view> distinct(hosts.begin(), hosts.end());
  return static_cast<int>(distinct.size());
}

int SiteConfig::node_of(int rank) const {
  if (hosts.empty()) return static_cast<int>(static_cast<int64_t>(rank) * nodes / ranks);
  // The index of hosts[rank] among the distinct addresses in rank order.
  std::vector<std::string_view> seen;
  for (const auto& h : hosts) {
    if (std::find(seen.begin(), seen.end(), h) == seen.end()) seen.push_back(h);
    if (h == hosts.at(static_cast<size_t>(rank))) break;
  }
  return static_cast<int>(seen.size()) - 1;
}

std::string SiteConfig::node_key(int rank) const {
  if (!finds_addresses()) return host_of(rank);
  const int node = node_of(rank);
  return node == 0 ? host : fmt::format("{}#node{}", name, node);
}

}  // namespace geoloco::trainer
