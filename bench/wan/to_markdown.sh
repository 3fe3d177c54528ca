#!/usr/bin/env bash
# bench/wan/to_markdown.sh BENCH_JSON: the docs/wan.md table from run_bench.sh's bench.json.
set -euo pipefail
(($# == 1)) || { echo "usage: $0 DIR/bench.json" >&2; exit 2; }
jq -r '
  def f(x; n): if x == null then "-" else (x * pow(10; n) | round / pow(10; n) | tostring) end;
  def mb(x): if x == null then "-" else f(x / 1e6; 1) end;
  "| scenario | mode | wall s | compute s | compute util. | WAN MB sent | val loss | outer steps | mean sync s |",
  "|---|---|---|---|---|---|---|---|---|",
  (.scenarios[] | . as $e |
    (["geoloco", "ddp"][] as $m | $e[$m] as $x |
      "| \($e.scenario) | \(if $m == "ddp" then "per-step DP" else "geoloco H=10 int8" end) | \(f($x.wall_s; 1)) | \(f($x.compute_s; 1)) | \(f($x.compute_utilization; 2)) | \(mb($x.wan_bytes_sent_total)) | \(f($x.val_loss; 3)) | \($x.outer_steps // "-") | \(f($x.sync_seconds_mean; 3)) |"),
    "| \($e.scenario) | **ratio DP/geoloco** | **\(f($e.ratio.wall_ddp_over_geoloco; 2))x** | | | **\(f($e.ratio.wan_bytes_ddp_over_geoloco; 1))x** | | | |")' "$1"
