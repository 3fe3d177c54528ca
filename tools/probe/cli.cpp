#include "tools/probe/cli.hpp"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>

#include "compression/codec.hpp"
#include "planner/quantity.hpp"
#include "tools/probe/probe_report.hpp"
#include "tools/probe/probe_runner.hpp"
#include "core/log.hpp"
#include "trainer/loop/run_config.hpp"

namespace geoloco::probe {

namespace {

uint64_t count_flag(const std::string& text, const char* flag) {
  const double v = planner::parse_count(text, flag);
  if (!(v >= 0) || v > 9.0e18 || v != std::floor(v))
    throw InputError(fmt::format("{} '{}': expected a whole number of bytes", flag, text));
  return static_cast<uint64_t>(v);
}

RunnerOptions runner_options(const ProbeFlags& f, std::ostream& notes) {
  RunnerOptions o;
  ProbeOptions& p = o.probe;
  if (f.count < 1) throw InputError(fmt::format("probe: --count {}: expected >= 1", f.count));
  if (f.warmup < 0) throw InputError(fmt::format("probe: --warmup {}: expected >= 0", f.warmup));
  if (f.ping_bytes < 0) throw InputError(fmt::format("probe: --ping-bytes {}: expected >= 24", f.ping_bytes));
  if (f.window < 1) throw InputError(fmt::format("probe: --window {}: expected >= 1", f.window));
  p.ping_count = static_cast<uint32_t>(f.count);
  p.ping_warmup = static_cast<uint32_t>(f.warmup);
  p.ping_bytes = static_cast<uint32_t>(f.ping_bytes);
  p.bytes = f.bytes.empty() ? 0 : count_flag(f.bytes, "--bytes");
  // --bytes alone: the streams end on bytes, not on time.
  p.seconds = !f.bytes.empty() && !f.seconds_given ? 0 : f.seconds;
  p.omit_s = f.omit;
  p.message_bytes = count_flag(f.message_bytes, "--message-bytes");
  p.window = static_cast<uint32_t>(f.window);
  if (!f.quiet) p.progress = [&notes](const std::string& s) { notes << "probe: " << s << "\n" << std::flush; };
  o.connections = f.connections;
  o.timeout_s = f.timeout.value_or(30.0);
  o.psk_file = f.psk_file;
  return o;
}

std::optional<int> codec_bits_for_budget(const compression::PipelineConfig& c) {
  if (c.topk) return std::nullopt;  // bytes per value depend on the kept fraction: not a bit width
  return compression::codec_bits(c.codec);
}

}  // namespace

std::string run_probe(const ProbeFlags& f, std::ostream& notes) {
  const int modes = (f.config.empty() ? 0 : 1) + (f.listen.empty() ? 0 : 1) + (f.connect.empty() ? 0 : 1);
  if (modes != 1)
    throw InputError(
        "probe: give exactly one of: a run config with --site NAME, --listen ADDR:PORT, --connect ADDR:PORT");
  if (f.config.empty() && (!f.site.empty() || !f.sets.empty()))
    throw InputError("probe: --site and --set go with a run config");
  if (!f.config.empty() && f.site.empty())
    throw InputError("probe: a run config needs --site NAME (this machine's site)");
  if (!f.config.empty() && !f.psk_file.empty())
    throw InputError("probe: --psk-file is for --listen/--connect; with a run config the key is transport.psk_file");

  RunnerOptions o = runner_options(f, notes);
  ProbeRun run;
  std::optional<BudgetContext> ctx;
  if (!f.listen.empty()) {
    run = run_listen(parse_endpoint(f.listen, "--listen", true), o);
  } else if (!f.connect.empty()) {
    run = run_connect(parse_endpoint(f.connect, "--connect"), o);
  } else {
    auto cfg = trainer::load_run_config(f.config, f.sets);
    if (cfg.sites.size() < 2) throw InputError(fmt::format("probe: {} has one site; nothing to probe", f.config));
    if (!cfg.transport) throw InputError(fmt::format("probe: {} has no transport: section", f.config));
    if (!f.timeout) o.timeout_s = cfg.transport->connect_timeout_s;
    std::vector<SiteSpec> sites;
    for (const auto& s : cfg.sites) sites.push_back({s.name, s.host_of(0), s.port});
    run = run_sites(sites, f.site, *cfg.transport, cfg.run.name, o);
    run.endpoint = f.config;
    BudgetContext c;
    c.config = f.config;
    c.params = cfg.model.num_params();
    c.bits = codec_bits_for_budget(cfg.outer.compression);
    c.block = cfg.outer.compression.block;
    c.H = cfg.outer.interval;
    c.fragments = cfg.outer.fragments;
    c.overlap_steps = cfg.outer.overlap_steps;
    c.ranks = cfg.sites.front().ranks;
    for (const auto& s : cfg.sites) c.ranks = std::min(c.ranks, s.ranks);
    c.lanes = cfg.transport->lanes;
    ctx = c;
  }
  if (!f.out.empty()) {
    const std::string text = budget_yaml(run, ctx);
    std::ofstream out(f.out);
    if (!out || !(out << text) || !out.flush()) throw FileError(f.out, "cannot write the budget YAML");
    if (!f.quiet)
      notes << fmt::format("probe: wrote {} (geoloco budget --from {}{})\n", f.out, f.out,
                           ctx ? " --step-time S" : " --params N --step-time S")
            << std::flush;
  }
  return f.json ? probe_json(run).dump(2) + "\n" : format_probe_table(run);
}

void add_probe_command(CLI::App& app) {
  auto f = std::make_shared<ProbeFlags>();
  auto* cmd =
      app.add_subcommand("probe",
                         "measure the WAN path to another site over UCX: RTT, 1- and N-connection throughput, TCP "
                         "retransmissions; writes a budget YAML (docs/planning.md)");
  cmd->add_option("config", f->config, "run config: probe every other site of it (run at every site with --site)");
  cmd->add_option("--site", f->site, "this machine's site in the run config");
  cmd->add_option("--set", f->sets, "override a config key: --set sites.0.host=198.18.1.2 (repeatable)");
  cmd->add_option("--listen", f->listen, "responder: wait for one initiator on ADDR:PORT (like iperf3 -s)");
  cmd->add_option("--connect", f->connect, "initiator: probe the responder at ADDR:PORT (like iperf3 -c)");
  cmd->add_option("--connections", f->connections,
                  "N: TCP connections (transport lanes) for the N-connection stream; "
                  "both sides must agree (default 4)");
  cmd->add_option("--seconds", f->seconds, "length of each throughput stream after the omitted start (default 5)")
      ->each([f](const std::string&) { f->seconds_given = true; });
  cmd->add_option("--bytes", f->bytes, "end each stream after this many bytes instead (e.g. 2GiB)");
  cmd->add_option("--count", f->count, "round-trip pings counted (default 50)");
  cmd->add_option("--warmup", f->warmup, "pings sent first and not counted (default 5)");
  cmd->add_option("--ping-bytes", f->ping_bytes, "size of one ping message (default 64, at least 24)");
  cmd->add_option("--message-bytes", f->message_bytes, "size of one stream message (default 1MiB)");
  cmd->add_option("--window", f->window,
                  "stream messages in flight (default 16); window x message size must exceed the path's "
                  "bandwidth-delay product (the output flags a figure the probe's pipeline may have limited)");
  cmd->add_option("--omit", f->omit,
                  "seconds at the start of each stream left out of its figure "
                  "(default 0.2 + 10 x RTT: TCP slow start)");
  cmd->add_option("--timeout", f->timeout,
                  "seconds to wait for the peer(s) to connect "
                  "(default 30, or the config's transport.connect_timeout_s)");
  cmd->add_option("--psk-file", f->psk_file,
                  "pre-shared key file for --listen/--connect (both sides); default: a "
                  "public key (integrity, not authentication)");
  cmd->add_option("--out", f->out, "write a budget YAML (format: geoloco-budget, measured: section) here");
  cmd->add_flag("--json", f->json, "print one JSON document instead of the table");
  cmd->add_flag("--quiet", f->quiet, "no progress lines on stderr");
  cmd->add_flag("--verbose", f->verbose, "log the transport's connection events on stderr");
  cmd->callback([f] {
    // The transport's own warnings repeat what the final error says; --verbose shows them.
    log::init("", f->verbose ? "info" : "critical");
    std::cout << run_probe(*f, std::cerr) << std::flush;
  });
}

}  // namespace geoloco::probe
