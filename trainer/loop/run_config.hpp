// RunConfig: the whole run, parsed once from YAML (plus --set overrides) into the typed
// configs owned by each component. See docs/config.md for every key.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "outer_optimizer/outer_config.hpp"
#include "core/config_node.hpp"
#include "transport/transport_config.hpp"
#include "trainer/data/data_config.hpp"
#include "trainer/model/model_config.hpp"
#include "trainer/loop/rehearsal.hpp"
#include "trainer/optim/inner_optimizer.hpp"
#include "trainer/optim/schedule.hpp"

namespace geoloco::trainer {

struct RunSection {
  std::string name = "geoloco";
  uint64_t seed = 1234;
  std::string output_dir;  // default: runs/<name>, relative to the working directory
  std::string log_level = "info";
  // Prometheus metrics over HTTP (trainer/loop/live_metrics.hpp): global rank g serves
  // http://metrics_host:(metrics_port + g)/metrics. 0: off.
  int metrics_port = 0;
  std::string metrics_host = "127.0.0.1";
  // The inner loop is this program's, not geoloco's (a PyTorch script over the `geoloco`
  // Python package, python/): `geoloco launch` starts it once per rank, with the rank's place
  // and its site's torch.distributed rendezvous in the environment (docs/pytorch.md). Then
  // model: and data: are the program's own (refused here), and train: holds only steps,
  // checkpoint_every, keep_checkpoints and log_every. argv[0] is looked up in PATH; relative
  // paths are the program's business (the launch's working directory).
  std::vector<std::string> command;
};

struct LrScaling {
  std::string kind = "none";  // none | linear: lr *= effective_batch / base_batch
  int64_t base_batch = 0;     // sequences; required for linear
};

struct TrainConfig {
  int64_t steps = 1000;  // inner optimizer steps per rank
  int micro_batch = 8;   // sequences per forward/backward
  int grad_accum = 1;    // micro-batches per optimizer step
  int seq_len = 0;       // tokens per sequence; 0 = model.block_size
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  LrScaling lr_scaling;
  double grad_clip = 1.0;          // max global gradient norm; 0 disables
  std::string precision = "fp32";  // fp32 | bf16 (bf16 on CUDA devices only)
  std::string attention = "auto";  // auto | fused | materialized (CUDA; fused: bf16, head size 16k <= 64)
  int threads = 1;                 // CPU threads per rank (OpenMP + BLAS)
  int64_t log_every = 10;          // steps between metrics.jsonl lines
  int64_t eval_every = 0;          // steps between validation passes; 0 = only at the end
  int eval_batches = 8;            // micro-batches per validation pass
  int64_t checkpoint_every = 0;    // steps between checkpoints; 0 = only at the end
  int keep_checkpoints = 2;        // newest checkpoints kept
  // Warm start: the model file the parameters start from instead of the seeded init (a
  // geoloco or Hugging Face GPT-2 safetensors file, a checkpoint step directory, a site's
  // checkpoint directory or a one-site run's output: find_model_file). Resolved against the
  // config's directory and checked against the model at load time; empty = seeded init.
  // On --resume the run's own checkpoint wins.
  std::string init_from;
  // A rehearsal (rehearsal.hpp): the outer loop at real size behind a stand-in inner loop.
  RehearsalConfig rehearsal;

  static TrainConfig from_yaml(const config::Node& node);
};

struct SiteConfig {
  std::string name;
  int ranks = 1;
  std::string host = "127.0.0.1";  // where this site's ranks listen (rank 0 serves the rendezvous)
  std::vector<std::string> hosts;  // per-rank addresses when a site spans several nodes (else all `host`)
  // Without `hosts`: the site spans this many nodes, ranks in equal runs (rank r on node
  // r * nodes / ranks). Node 0's ranks bind `host` (rank 0 serves the rendezvous and the site
  // directory); the others find their own address (`--bind-address`, GEOLOCO_BIND_ADDRESS,
  // or the interface that reaches `host`) and the other sites learn it from rank 0.
  int nodes = 1;
  int port = 29500;              // rank r listens on port + r (WAN); rendezvous on port + ranks
  std::string strategy = "ddp";  // ddp | zero1 | zero2 | fsdp | hybrid (auto in the YAML: chosen at load or start)
  int group_size = 0;            // hybrid: ranks per group, sharded inside, replicated across
  // strategy: auto -- the site's GPU topology and what the cost model needs besides.
  struct TopologySource {
    std::string file;           // nvidia-smi topo -m text or topology YAML; "" on a cuda site: nvidia-smi at start
    double gpu_tflops = 400;    // achieved bf16 TFLOP/s per GPU: the step's compute time
    double gpu_memory_gb = 80;  // per GPU
    double activations_gb = 0;  // per GPU, whatever the strategy
    int nodes = 1;              // the site spans this many nodes of this topology (set from the site's own nodes)
    double node_link_gbs = 50;  // per GPU and direction between nodes (its share of the NICs)
    double node_link_latency_us = 5;
  } topology;
  bool strategy_auto = false;   // the YAML said auto
  std::string strategy_reason;  // auto: why `strategy` (set once chosen)
  std::string device = "cpu";   // cpu | cuda
  int grad_accum = 0;           // micro-batches per optimizer step here (0 in the YAML: train.grad_accum)
  // Rehearsing slower hardware: each inner step's forward/backward here takes `slowdown`
  // times its time (the rank sleeps the rest, counted as compute), as on GPUs that many times
  // slower; a rehearsal's step_seconds is multiplied by it.
  double slowdown = 1;

  const std::string& host_of(int rank) const { return hosts.empty() ? host : hosts.at(static_cast<size_t>(rank)); }
  // Its ranks beyond node 0 find their own addresses (nodes > 1 without hosts).
  bool finds_addresses() const { return hosts.empty() && nodes > 1; }
  // The nodes its ranks run on: `nodes`, or the distinct addresses of `hosts`.
  int node_count() const;
  // The node rank `rank` runs on (an index in node order: hosts' distinct addresses, or nodes).
  int node_of(int rank) const;
  // Names the machine rank `rank` runs on, equal for ranks (of any site) on the same machine
  // as far as the config knows: its address, or "<site>#node<j>" for a node that finds its own.
  std::string node_key(int rank) const;
};

struct RunConfig {
  std::string path;  // the config file as given
  std::string dir;   // its directory: relative data/key paths resolve against it
  RunSection run;
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  std::vector<SiteConfig> sites;
  outer::OuterConfig outer;                             // enabled for every multi-site run (defaults), or when present
  std::optional<transport::TransportConfig> transport;  // required for multi-site runs
  uint64_t hash = 0;           // hash of the canonical (post-override) YAML: sites refuse mismatches
  std::string canonical_yaml;  // that YAML: the config as it ran (written to <output_dir>/config.yaml)

  // run.command is set: the ranks run the user's program over the Python package.
  bool external_inner_loop() const { return !run.command.empty(); }
  int world_size() const;                         // ranks over all sites
  int global_rank(int site, int rank) const;      // sites in config order, ranks contiguous
  int site_index(const std::string& name) const;  // -1 when absent
  int seq_len() const { return train.seq_len > 0 ? train.seq_len : model.block_size; }
  // Sequences per optimizer step summed over every rank of every site.
  int64_t global_batch() const;
  // Sequences per optimizer step of one site (what DiLoCo's inner loop sees).
  int64_t site_batch(int site) const;
  // Peak lr after optional linear batch scaling.
  double peak_lr() const;
};

// Load, apply overrides, validate everything. Throws ConfigError/FileError (exit 2).
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides = {});
RunConfig parse_run_config(const config::Document& doc);

}  // namespace geoloco::trainer
