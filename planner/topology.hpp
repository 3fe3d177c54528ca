// Intra-site GPU topology for `geoloco topo`: who is linked to whom, how fast.
//
// Two sources: the text of `nvidia-smi topo -m` (a matrix of X, NV#, PIX, PXB, PHB, NODE,
// SYS), or a YAML list of links with bandwidths. Either becomes a symmetric G x G matrix of
// PairLink; the cost model only asks for ring bottlenecks and NVLink islands.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config_node.hpp"

namespace geoloco::planner {

// Ordered fastest to slowest class of path between two GPUs.
enum class LinkKind { NVLink, PcieSwitch, PcieHost, PcieNode, Sys };
const char* link_kind_name(LinkKind k);

// Per-direction bandwidths and per-hop latencies the matrix tokens translate to. Defaults
// are nominal figures (docs/planning.md); the YAML `assumptions:` section overrides them.
struct LinkAssumptions {
  double nvlink_GBps_per_link = 25;  // NVLink 3/4: 25 GB/s per link per direction
  double pcie_GBps = 32;             // PCIe 4.0 x16 per direction
  double pix_factor = 1.0;           // through one PCIe switch: full P2P
  double pxb_factor = 1.0;           // several PCIe switches: still P2P
  double phb_factor = 0.8;           // through the CPU's host bridge
  double node_factor = 0.8;          // between host bridges of one NUMA node
  double sys_factor = 0.5;           // across the socket interconnect: no P2P, bounced via host memory
  double nvlink_latency_s = 2e-6;
  double pcie_latency_s = 5e-6;
  double sys_latency_s = 10e-6;

  static LinkAssumptions from_yaml(const config::Node& node);
};

struct PairLink {
  LinkKind kind = LinkKind::Sys;
  int nvlinks = 0;           // NV# count (0 if not NVLink)
  double bandwidth_Bps = 0;  // per direction
  double latency_s = 0;      // per ring hop
  std::string token;         // as written in the source ("NV18", "SYS", "nvlink 100 GB/s")
};

class Topology {
 public:
  Topology(std::string name, int gpus);

  const std::string& name() const { return name_; }
  int gpus() const { return gpus_; }
  const PairLink& link(int a, int b) const { return links_.at(static_cast<size_t>(a * gpus_ + b)); }
  void set_link(int a, int b, const PairLink& l);  // symmetric

  // The NVLink islands: connected components of NVLink pairs (singletons for PCIe-only).
  std::vector<std::vector<int>> nvlink_islands() const;

  // Best ring through `members` (all distinct GPU ids): the Hamiltonian cycle maximizing its
  // slowest hop. Returns that hop. Exact search (bitmask DP), at most 16 members unless every hop is alike.
  struct Ring {
    double bandwidth_Bps = 0;
    double latency_s = 0;    // of the slowest hop
    std::string bottleneck;  // token of the slowest hop
    std::vector<int> order;
  };
  Ring best_ring(const std::vector<int>& members) const;

 private:
  std::string name_;
  int gpus_;
  std::vector<PairLink> links_;
};

// Parses `nvidia-smi topo -m` output. `name` is used in error messages ("file:line").
// InputError on an unknown token, a ragged or asymmetric matrix, or no GPU rows.
Topology parse_nvidia_smi_topo(const std::string& text, const std::string& name, const LinkAssumptions& a);

// Identifies a topology YAML.
inline constexpr const char* kTopologyFormat = "geoloco-topology";
inline constexpr int kTopologyVersion = 1;

// The YAML form (docs/planning.md):
//   format: geoloco-topology
//   version: 1
//   gpus: 8
//   switch: {kind: nvlink, bandwidth_gbs: 450}       # optional: every pair through a switch
//   links: [{gpus: [0, 1], kind: nvlink, bandwidth_gbs: 100}, ...]
//   default: {kind: sys, bandwidth_gbs: 16}          # pairs not covered above
//   nvidia_smi: |                                     # alternatively, the matrix text
//     ...
//   assumptions: {...}                                # LinkAssumptions overrides
Topology topology_from_yaml(const config::Node& root);

// A file holding either form: YAML if it starts with a `format:` key, else nvidia-smi text.
Topology load_topology_file(const std::string& path);

// `nodes` copies of one node's topology (GPU g of node k is GPU k x gpus + g), every pair across
// nodes joined by the network: `bandwidth_Bps` per direction and `latency_s` per hop (a GPU's
// share of the node's NICs). nodes == 1 returns `node`. InputError when nodes < 1 or the
// bandwidth is not positive.
Topology replicate_over_nodes(const Topology& node, int nodes, double bandwidth_Bps, double latency_s);

}  // namespace geoloco::planner
