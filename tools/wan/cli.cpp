#include "tools/wan/cli.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "tools/wan/delayline.hpp"
#include "tools/wan/pingpong.hpp"
#include "tools/wan/scenario.hpp"
#include "core/error.hpp"

namespace geoloco::wan {
namespace {

void add_delayline(CLI::App& app) {
  auto opt = std::make_shared<DelaylineOptions>();
  auto gso = std::make_shared<std::string>("auto");
  auto* c = app.add_subcommand("wan-delayline", "Userspace delay line on one NFQUEUE (netem fallback; needs root)");
  c->add_option("--queue", opt->queue, "NFQUEUE number")->required();
  c->add_option("--delay-ms", opt->delay_ms, "one-way delay (ms)")->required();
  c->add_option("--jitter-ms", opt->jitter_ms, "uniform jitter +/- (ms), <= delay");
  c->add_option("--loss", opt->loss_pct, "per-packet loss (percent)");
  c->add_option("--seed", opt->seed, "seed for jitter and loss draws");
  c->add_flag("--reorder", opt->reorder, "let jitter reorder packets");
  c->add_flag("!--no-compensate", opt->compensate, "do not wake early by the measured timer latency");
  c->add_option("--queue-maxlen", opt->queue_maxlen, "kernel queue length (packets)");
  c->add_option("--gso", *gso, "pass GSO super-packets whole: auto (on unless --loss > 0), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  c->add_option("--stats-file", opt->stats_file, "write JSON stats here on exit");
  c->add_option("--ready-file", opt->ready_file, "create this file once the queue is bound");
  c->add_option("--duration-s", opt->duration_s, "stop after this many seconds (0 = until SIGTERM)");
  c->callback([opt, gso] {
    // Loss must hit wire-sized packets: a dropped 64 KiB GSO packet would be ~44 losses at once.
    opt->gso = *gso == "on" || (*gso == "auto" && opt->loss_pct == 0.0);
    run_delayline(*opt);
  });
}

void add_pingpong(CLI::App& app) {
  auto srv = std::make_shared<PingpongServerOptions>();
  auto cli = std::make_shared<PingpongClientOptions>();
  auto listen = std::make_shared<std::string>();
  auto* c = app.add_subcommand(
      "wan-pingpong", "Application-level TCP ping-pong: --listen (server) or --connect (client, prints RTT JSON)");
  auto* lo = c->add_option("--listen", *listen, "serve on ADDR:PORT");
  auto* co = c->add_option("--connect", cli->connect, "ping ADDR:PORT");
  lo->excludes(co);
  c->add_option("--connections", srv->connections, "server: clients to serve before exiting (0 = forever)");
  c->add_option("--ready-file", srv->ready_file, "server: create this file once listening");
  c->add_option("--count", cli->count, "client: pings measured");
  c->add_option("--warmup", cli->warmup, "client: pings sent first and not measured");
  c->add_option("--size", cli->size, "client: message bytes (>= 24)");
  c->add_option("--interval-ms", cli->interval_ms, "client: pause between pings");
  c->add_option("--connect-timeout-s", cli->connect_timeout_s, "client: keep retrying the connect this long");
  auto timeout = std::make_shared<double>(30.0);
  c->add_option("--timeout-s", *timeout, "per-echo (client) / idle (server) deadline");
  c->callback([srv, cli, listen, timeout] {
    if (listen->empty() == cli->connect.empty())
      throw InputError("wan-pingpong: give exactly one of --listen, --connect");
    if (!listen->empty()) {
      srv->listen = *listen;
      srv->timeout_s = *timeout;
      run_pingpong_server(*srv);
    } else {
      cli->timeout_s = *timeout;
      std::cout << run_pingpong_client(*cli).to_json() << std::endl;
    }
  });
}

// Training config sites, mapped onto scenario sites: by name when every config site name is a
// scenario site, else by position.
void print_config_mapping(const Scenario& sc, const Plan& plan, const std::string& config_path, bool json) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(config_path);
  } catch (const YAML::BadFile&) {
    throw FileError(config_path, "cannot read");
  } catch (const YAML::Exception& e) {
    throw FileError(config_path, std::string("bad YAML: ") + e.what());
  }
  const YAML::Node sites = root["sites"];
  if (!sites || !sites.IsSequence() || sites.size() == 0)
    throw InputError(fmt::format("{}: no 'sites' sequence to map onto the WAN namespaces", config_path));
  if (sites.size() > sc.sites.size())
    throw InputError(
        fmt::format("{}: {} sites but scenario '{}' has only {}", config_path, sites.size(), sc.name, sc.sites.size()));
  std::vector<std::string> names;
  bool by_name = true;
  for (std::size_t i = 0; i < sites.size(); ++i) {
    std::string n = sites[i]["name"] ? sites[i]["name"].as<std::string>() : fmt::format("site{}", i);
    if (std::find(sc.sites.begin(), sc.sites.end(), n) == sc.sites.end()) by_name = false;
    names.push_back(n);
  }
  std::vector<std::size_t> idx;
  for (std::size_t i = 0; i < names.size(); ++i) idx.push_back(by_name ? sc.site_index(names[i]) : i);
  if (json) return;  // JSON output carries only the plan; the scripts use the shell form
  std::cout << "WAN_CFG_MAP_BY=" << (by_name ? "name" : "position") << "\nWAN_CFG_SITES=(";
  for (std::size_t i = 0; i < names.size(); ++i) std::cout << (i ? " " : "") << "'" << names[i] << "'";
  std::cout << ")\nWAN_CFG_SITE_IDX=(";
  for (std::size_t i = 0; i < idx.size(); ++i) std::cout << (i ? " " : "") << idx[i];
  std::cout << ")\nWAN_CFG_RANKS=(";
  for (std::size_t i = 0; i < sites.size(); ++i) {
    int ranks = 1;
    try {
      if (sites[i]["ranks"]) ranks = sites[i]["ranks"].as<int>();
    } catch (const YAML::Exception&) {
      throw InputError(fmt::format("{}: sites[{}].ranks is not an integer", config_path, i));
    }
    if (ranks < 1) throw InputError(fmt::format("{}: sites[{}].ranks is {}, expected >= 1", config_path, i, ranks));
    std::cout << (i ? " " : "") << ranks;
  }
  std::cout << ")\nWAN_CFG_SETS=(";
  for (std::size_t i = 0; i < idx.size(); ++i)
    std::cout << (i ? " " : "") << "--set sites." << i << ".host=" << plan.sites[idx[i]].addr;
  std::cout << ")\n";
}

void add_plan(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto prefix = std::make_shared<std::string>("gl");
  auto format = std::make_shared<std::string>("sh");
  auto sets = std::make_shared<std::vector<std::string>>();
  auto config = std::make_shared<std::string>();
  auto* c =
      app.add_subcommand("wan-plan", "Scenario YAML -> namespaces, addresses, queues and rates for tools/wan scripts");
  c->add_option("scenario", *path, "scenario YAML (configs/wan/*.yaml)")->required();
  c->add_option("--prefix", *prefix, "namespace name prefix");
  c->add_option("--format", *format, "sh (eval-able bash) or json")->check(CLI::IsMember({"sh", "json"}));
  c->add_option("--set", *sets, "override a scenario key, e.g. link.loss_pct=1");
  c->add_option("--config", *config, "training config whose sites are mapped onto the namespaces (sh only)");
  c->callback([=] {
    const Scenario sc = Scenario::load(*path, *sets);
    const Plan plan = make_plan(sc, *prefix);
    std::cout << (*format == "sh" ? plan_to_shell(plan) : plan_to_json(plan));
    if (!config->empty()) print_config_mapping(sc, plan, *config, *format == "json");
    std::cout.flush();
  });
}

}  // namespace

void add_wan_commands(CLI::App& app) {
  add_delayline(app);
  add_pingpong(app);
  add_plan(app);
}

}  // namespace geoloco::wan
