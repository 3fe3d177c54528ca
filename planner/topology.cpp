#include "planner/topology.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <fstream>
#include <numeric>
#include <regex>
#include <sstream>

#include "planner/yaml_section.hpp"

namespace geoloco::planner {
namespace {

constexpr double kGB = 1e9;

std::vector<std::string> split_ws(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream in(line);
  for (std::string t; in >> t;) out.push_back(t);
  return out;
}

// nvidia-smi underlines the header with ANSI escapes when writing to a terminal.
std::string strip_ansi(const std::string& s) {
  static const std::regex ansi("\x1b\\[[0-9;]*m");
  return std::regex_replace(s, ansi, "");
}

bool is_gpu_name(const std::string& t, int* index) {
  if (t.size() < 4 || t.compare(0, 3, "GPU") != 0) return false;
  for (size_t i = 3; i < t.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(t[i]))) return false;
  if (index) *index = std::stoi(t.substr(3));
  return true;
}

PairLink link_from_token(const std::string& tok, const LinkAssumptions& a, bool* ok) {
  PairLink l;
  l.token = tok;
  *ok = true;
  const double pcie = a.pcie_GBps * kGB;
  if (tok.size() > 2 && tok.compare(0, 2, "NV") == 0 &&
      std::all_of(tok.begin() + 2, tok.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    l.kind = LinkKind::NVLink;
    l.nvlinks = std::stoi(tok.substr(2));
    if (l.nvlinks < 1) *ok = false;
    l.bandwidth_Bps = l.nvlinks * a.nvlink_GBps_per_link * kGB;
    l.latency_s = a.nvlink_latency_s;
  } else if (tok == "PIX") {
    l = {LinkKind::PcieSwitch, 0, pcie * a.pix_factor, a.pcie_latency_s, tok};
  } else if (tok == "PXB") {
    l = {LinkKind::PcieSwitch, 0, pcie * a.pxb_factor, a.pcie_latency_s, tok};
  } else if (tok == "PHB") {
    l = {LinkKind::PcieHost, 0, pcie * a.phb_factor, a.pcie_latency_s, tok};
  } else if (tok == "NODE") {
    l = {LinkKind::PcieNode, 0, pcie * a.node_factor, a.pcie_latency_s, tok};
  } else if (tok == "SYS" || tok == "SOC") {  // SOC: the pre-2018 name of SYS
    l = {LinkKind::Sys, 0, pcie * a.sys_factor, a.sys_latency_s, tok};
  } else {
    *ok = false;
  }
  return l;
}

}  // namespace

const char* link_kind_name(LinkKind k) {
  switch (k) {
    case LinkKind::NVLink: return "nvlink";
    case LinkKind::PcieSwitch: return "pcie_switch";
    case LinkKind::PcieHost: return "pcie_host";
    case LinkKind::PcieNode: return "pcie_node";
    case LinkKind::Sys: return "sys";
  }
  return "?";
}

LinkAssumptions LinkAssumptions::from_yaml(const config::Node& n) {
  LinkAssumptions a;
  a.nvlink_GBps_per_link = n.get_double("nvlink_gbs_per_link", a.nvlink_GBps_per_link, 0.001, 1e6);
  a.pcie_GBps = n.get_double("pcie_gbs", a.pcie_GBps, 0.001, 1e6);
  a.pix_factor = n.get_double("pix_factor", a.pix_factor, 0.001, 1);
  a.pxb_factor = n.get_double("pxb_factor", a.pxb_factor, 0.001, 1);
  a.phb_factor = n.get_double("phb_factor", a.phb_factor, 0.001, 1);
  a.node_factor = n.get_double("node_factor", a.node_factor, 0.001, 1);
  a.sys_factor = n.get_double("sys_factor", a.sys_factor, 0.001, 1);
  a.nvlink_latency_s = n.get_double("nvlink_latency_us", a.nvlink_latency_s * 1e6, 0, 1e6) * 1e-6;
  a.pcie_latency_s = n.get_double("pcie_latency_us", a.pcie_latency_s * 1e6, 0, 1e6) * 1e-6;
  a.sys_latency_s = n.get_double("sys_latency_us", a.sys_latency_s * 1e6, 0, 1e6) * 1e-6;
  n.finish();
  return a;
}

Topology::Topology(std::string name, int gpus) : name_(std::move(name)), gpus_(gpus) {
  if (gpus < 1 || gpus > 1024) throw InputError(fmt::format("{}: got {} GPUs, expected 1..1024", name_, gpus));
  links_.resize(static_cast<size_t>(gpus) * gpus);
}

void Topology::set_link(int a, int b, const PairLink& l) {
  GEOLOCO_CHECK(a >= 0 && a < gpus_ && b >= 0 && b < gpus_ && a != b, "bad pair {} {}", a, b);
  links_[static_cast<size_t>(a * gpus_ + b)] = l;
  links_[static_cast<size_t>(b * gpus_ + a)] = l;
}

std::vector<std::vector<int>> Topology::nvlink_islands() const {
  std::vector<int> comp(static_cast<size_t>(gpus_), -1);
  std::vector<std::vector<int>> out;
  for (int s = 0; s < gpus_; ++s) {
    if (comp[static_cast<size_t>(s)] >= 0) continue;
    std::vector<int> island, stack{s};
    comp[static_cast<size_t>(s)] = static_cast<int>(out.size());
    while (!stack.empty()) {
      int v = stack.back();
      stack.pop_back();
      island.push_back(v);
      for (int w = 0; w < gpus_; ++w) {
        if (w == v || comp[static_cast<size_t>(w)] >= 0 || link(v, w).kind != LinkKind::NVLink) continue;
        comp[static_cast<size_t>(w)] = comp[static_cast<size_t>(s)];
        stack.push_back(w);
      }
    }
    std::sort(island.begin(), island.end());
    out.push_back(std::move(island));
  }
  return out;
}

Topology::Ring Topology::best_ring(const std::vector<int>& members) const {
  const int n = static_cast<int>(members.size());
  if (n < 2) throw InputError(fmt::format("{}: a ring needs at least 2 GPUs", name_));
  // Every hop alike (a switch, or a uniform PCIe tree): any order is a best ring.
  {
    const PairLink& first = link(members[0], members[1]);
    bool uniform = true;
    for (int i = 0; i < n && uniform; ++i)
      for (int j = i + 1; j < n && uniform; ++j) {
        const PairLink& l = link(members[static_cast<size_t>(i)], members[static_cast<size_t>(j)]);
        uniform = l.bandwidth_Bps == first.bandwidth_Bps && l.latency_s == first.latency_s;
      }
    if (uniform) return Ring{first.bandwidth_Bps, first.latency_s, first.token, members};
  }
  if (n > 16) throw InputError(fmt::format("{}: {} GPUs in one ring; the exact ring search supports 16", name_, n));
  auto bw = [&](int i, int j) {
    return link(members[static_cast<size_t>(i)], members[static_cast<size_t>(j)]).bandwidth_Bps;
  };
  Ring best;
  if (n == 2) {
    const PairLink& l = link(members[0], members[1]);
    return Ring{l.bandwidth_Bps, l.latency_s, l.token, {members[0], members[1]}};
  }
  // Try thresholds from the fastest down; the first with a Hamiltonian cycle using only
  // hops >= threshold gives the best bottleneck. reach[mask] = set of end vertices of a
  // path from vertex 0 visiting exactly `mask`.
  std::vector<double> thresholds;
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) thresholds.push_back(bw(i, j));
  std::sort(thresholds.begin(), thresholds.end(), std::greater<>());
  thresholds.erase(std::unique(thresholds.begin(), thresholds.end()), thresholds.end());
  const uint32_t full = (1u << n) - 1;
  std::vector<uint32_t> reach(size_t(1) << n);
  std::vector<int> parent;  // for recovering the order: parent[(mask << 5) | v]
  for (double th : thresholds) {
    std::vector<uint32_t> adj(static_cast<size_t>(n), 0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        if (i != j && bw(i, j) >= th) adj[static_cast<size_t>(i)] |= 1u << j;
    std::fill(reach.begin(), reach.end(), 0u);
    reach[1] = 1u;  // path {0} ends at 0
    for (uint32_t mask = 1; mask <= full; ++mask) {
      if (!(mask & 1u) || !reach[mask]) continue;
      for (int v = 0; v < n; ++v) {
        if (!(reach[mask] >> v & 1u)) continue;
        uint32_t next = adj[static_cast<size_t>(v)] & ~mask;
        for (int w = 0; w < n; ++w)
          if (next >> w & 1u) reach[mask | (1u << w)] |= 1u << w;
      }
    }
    uint32_t ends = reach[full] & adj[0];
    if (!ends) continue;
    // Walk back from an end adjacent to 0.
    std::vector<int> order;
    uint32_t mask = full;
    int v = std::countr_zero(ends);
    while (true) {
      order.push_back(v);
      uint32_t prev_mask = mask & ~(1u << v);
      if (prev_mask == 0) break;
      int u = 0;
      for (; u < n; ++u)
        if ((reach[prev_mask] >> u & 1u) && (adj[static_cast<size_t>(u)] >> v & 1u)) break;
      GEOLOCO_CHECK(u < n, "ring reconstruction failed");
      mask = prev_mask;
      v = u;
    }
    std::reverse(order.begin(), order.end());
    best.bandwidth_Bps = th;
    double slowest = 1e300;
    for (int k = 0; k < n; ++k) {
      const PairLink& l = link(members[static_cast<size_t>(order[static_cast<size_t>(k)])],
                               members[static_cast<size_t>(order[static_cast<size_t>((k + 1) % n)])]);
      if (l.bandwidth_Bps < slowest || (l.bandwidth_Bps == slowest && l.latency_s > best.latency_s)) {
        slowest = l.bandwidth_Bps;
        best.latency_s = l.latency_s;
        best.bottleneck = l.token;
      }
      best.order.push_back(members[static_cast<size_t>(order[static_cast<size_t>(k)])]);
    }
    return best;
  }
  throw InputError(fmt::format("{}: no ring connects GPUs (a pair has zero bandwidth)", name_));
}

Topology parse_nvidia_smi_topo(const std::string& text, const std::string& name, const LinkAssumptions& a) {
  std::istringstream in(text);
  std::vector<std::string> header;
  int header_gpus = 0;
  std::vector<std::vector<std::string>> rows;  // GPU rows: the GPU-column cells
  std::vector<int> row_line;
  int lineno = 0;
  for (std::string raw; std::getline(in, raw);) {
    ++lineno;
    std::string line = strip_ansi(raw);
    auto tok = split_ws(line);
    if (tok.empty()) continue;
    if (tok[0] == "Legend:" || tok[0] == "NIC") break;  // the legend follows the matrix
    if (header.empty()) {
      // The header row: column names, first GPU0, ended by "CPU Affinity" & co.
      if (tok[0] != "GPU0") continue;
      for (const auto& t : tok) {
        int idx = 0;
        if (t == "CPU" || t == "NUMA" || t == "Affinity") break;
        if (is_gpu_name(t, &idx)) {
          if (idx != header_gpus)
            throw InputError(fmt::format("{}:{}: GPU columns out of order: '{}' where GPU{} was expected", name, lineno,
                                         t, header_gpus));
          ++header_gpus;
        }
        header.push_back(t);
      }
      continue;
    }
    int idx = -1;
    if (!is_gpu_name(tok[0], &idx)) continue;  // NIC rows: not needed
    if (idx != static_cast<int>(rows.size()))
      throw InputError(fmt::format("{}:{}: row '{}' out of order: expected GPU{}", name, lineno, tok[0], rows.size()));
    if (tok.size() < 1 + header.size())
      throw InputError(fmt::format("{}:{}: row {} has {} cells, the header has {} columns", name, lineno, tok[0],
                                   tok.size() - 1, header.size()));
    rows.emplace_back(tok.begin() + 1, tok.begin() + 1 + header_gpus);
    row_line.push_back(lineno);
  }
  if (header.empty() || header_gpus == 0)
    throw InputError(
        fmt::format("{}: no nvidia-smi topo -m matrix found (expected a header line starting with GPU0)", name));
  if (static_cast<int>(rows.size()) != header_gpus)
    throw InputError(fmt::format("{}: {} GPU columns but {} GPU rows", name, header_gpus, rows.size()));

  Topology topo(name, header_gpus);
  for (int i = 0; i < header_gpus; ++i) {
    for (int j = 0; j < header_gpus; ++j) {
      const std::string& t = rows[static_cast<size_t>(i)][static_cast<size_t>(j)];
      if (i == j) {
        if (t != "X")
          throw InputError(fmt::format("{}:{}: GPU{} x GPU{}: got '{}', expected X on the diagonal", name,
                                       row_line[static_cast<size_t>(i)], i, j, t));
        continue;
      }
      bool ok = false;
      PairLink l = link_from_token(t, a, &ok);
      if (!ok)
        throw InputError(
            fmt::format("{}:{}: GPU{} x GPU{}: unknown link '{}' (expected X, NV#, PIX, PXB, PHB, "
                        "NODE or SYS)",
                        name, row_line[static_cast<size_t>(i)], i, j, t));
      const std::string& mirror = rows[static_cast<size_t>(j)][static_cast<size_t>(i)];
      if (mirror != t)
        throw InputError(
            fmt::format("{}:{}: GPU{} x GPU{} is '{}' but GPU{} x GPU{} is '{}': the matrix must be "
                        "symmetric",
                        name, row_line[static_cast<size_t>(i)], i, j, t, j, i, mirror));
      if (j > i) topo.set_link(i, j, l);
    }
  }
  return topo;
}

namespace {

LinkKind kind_from_yaml(const config::Node& n, std::string_view key) {
  std::string k = n.get_choice(key, "", {"nvlink", "pcie_switch", "pcie_host", "pcie_node", "sys"});
  if (k == "nvlink") return LinkKind::NVLink;
  if (k == "pcie_switch") return LinkKind::PcieSwitch;
  if (k == "pcie_host") return LinkKind::PcieHost;
  if (k == "pcie_node") return LinkKind::PcieNode;
  return LinkKind::Sys;
}

PairLink link_from_yaml(const config::Node& n, const LinkAssumptions& a) {
  if (!n.has("kind")) n.fail("kind", "missing required key");
  PairLink l;
  l.kind = kind_from_yaml(n, "kind");
  if (!n.has("bandwidth_gbs")) n.fail("bandwidth_gbs", "missing required key");
  l.bandwidth_Bps = n.get_double("bandwidth_gbs", 0, 1e-3, 1e6) * kGB;
  l.latency_s = l.kind == LinkKind::NVLink ? a.nvlink_latency_s
                : l.kind == LinkKind::Sys  ? a.sys_latency_s
                                           : a.pcie_latency_s;
  l.latency_s = n.get_double("latency_us", l.latency_s * 1e6, 0, 1e6) * 1e-6;
  l.token = fmt::format("{} {:g} GB/s", link_kind_name(l.kind), l.bandwidth_Bps / kGB);
  return l;
}

}  // namespace

Topology topology_from_yaml(const config::Node& root) {
  const std::string format = root.get<std::string>("format", "");
  if (format != kTopologyFormat) root.fail_value("format", fmt::format("'{}'", kTopologyFormat));
  const int64_t version = root.get_int("version", 0, 0, 1 << 30);
  if (version != kTopologyVersion)
    root.fail("version", fmt::format("topology file version {} is not supported (this build reads {})", version,
                                     kTopologyVersion));
  const std::string name = root.get<std::string>("name", root.where());
  LinkAssumptions a = LinkAssumptions::from_yaml(section(root, "assumptions"));
  if (root.has("nvidia_smi")) {
    std::string text = root.get<std::string>("nvidia_smi", "");
    for (const char* k : {"gpus", "switch", "links", "default"})
      if (root.has(k)) root.fail(k, "give either nvidia_smi or gpus/switch/links/default, not both");
    root.finish();
    return parse_nvidia_smi_topo(text, name, a);
  }
  if (!root.has("gpus")) root.fail("gpus", "missing required key (or give nvidia_smi: the matrix text)");
  const int gpus = static_cast<int>(root.get_int("gpus", 0, 1, 1024));
  Topology topo(name, gpus);
  std::vector<bool> set(static_cast<size_t>(gpus) * gpus, false);
  auto assign = [&](int i, int j, const PairLink& l) {
    topo.set_link(i, j, l);
    set[static_cast<size_t>(i * gpus + j)] = set[static_cast<size_t>(j * gpus + i)] = true;
  };
  if (root.has("switch")) {
    auto sw = root.child("switch");
    PairLink l = link_from_yaml(sw, a);
    sw.finish();
    for (int i = 0; i < gpus; ++i)
      for (int j = i + 1; j < gpus; ++j) assign(i, j, l);
  }
  for (const auto& item : root.items("links")) {
    auto pair = item.get<std::vector<int>>("gpus", {});
    if (pair.size() != 2 || pair[0] == pair[1] || pair[0] < 0 || pair[1] < 0 || pair[0] >= gpus || pair[1] >= gpus)
      item.fail_value("gpus", fmt::format("two distinct GPU ids in [0, {}]", gpus - 1));
    PairLink l = link_from_yaml(item, a);
    item.finish();
    // A direct link adds to what a switch gives that pair only if faster.
    if (!set[static_cast<size_t>(pair[0] * gpus + pair[1])] ||
        l.bandwidth_Bps > topo.link(pair[0], pair[1]).bandwidth_Bps)
      assign(pair[0], pair[1], l);
  }
  if (root.has("default")) {
    auto d = root.child("default");
    PairLink l = link_from_yaml(d, a);
    d.finish();
    for (int i = 0; i < gpus; ++i)
      for (int j = i + 1; j < gpus; ++j)
        if (!set[static_cast<size_t>(i * gpus + j)]) assign(i, j, l);
  }
  root.finish();
  for (int i = 0; i < gpus; ++i)
    for (int j = i + 1; j < gpus; ++j)
      if (!set[static_cast<size_t>(i * gpus + j)])
        root.fail("links",
                  fmt::format("GPU{} and GPU{} have no link: add a switch:, a links: entry or a default:", i, j));
  return topo;
}

Topology load_topology_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FileError(path, "cannot open topology file");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  // YAML when the first meaningful line is the format key.
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    auto tok = split_ws(line);
    if (tok.empty() || tok[0][0] == '#') continue;
    if (tok[0] == "format:") {
      auto doc = config::load_string(text, path);
      return topology_from_yaml(doc.node());
    }
    break;
  }
  return parse_nvidia_smi_topo(text, path, LinkAssumptions{});
}

Topology replicate_over_nodes(const Topology& node, int nodes, double bandwidth_Bps, double latency_s) {
  if (nodes < 1) throw InputError(fmt::format("{}: got {} nodes, expected at least 1", node.name(), nodes));
  if (nodes == 1) return node;
  if (!(bandwidth_Bps > 0))
    throw InputError(fmt::format("{}: the link between nodes needs a positive bandwidth", node.name()));
  const int g = node.gpus();
  Topology t(fmt::format("{} x {} nodes", node.name(), nodes), g * nodes);
  PairLink net;
  net.kind = LinkKind::Sys;
  net.bandwidth_Bps = bandwidth_Bps;
  net.latency_s = latency_s;
  net.token = fmt::format("net {:.0f} GB/s", bandwidth_Bps / 1e9);
  for (int a = 0; a < g * nodes; ++a)
    for (int b = a + 1; b < g * nodes; ++b) t.set_link(a, b, a / g == b / g ? node.link(a % g, b % g) : net);
  return t;
}

}  // namespace geoloco::planner
