#!/usr/bin/env bash
# bench/quality/plot.sh: docs/quality.svg from results/*.json -- the final validation loss of
# every row of 3 seeds or more (mean, with the seeds' min-max as the error bar; tune.json's
# one-seed rows are left out), sorted by WAN bytes; gnuplot.
#   bench/quality/plot.sh [OUT.svg]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/../../docs/quality.svg}"
data="$(mktemp)"
trap 'rm -f "$data"' EXIT
# One line per row: index, label, mean, min, max (rows of every result, DiLoCo first by bytes).
jq -rs '[.[] | .rows[] | select((.seeds | length) >= 3)] | unique_by(.row) | sort_by(-(.wan_bytes_mean // 0), .row) |
        to_entries[] | "\(.key) \"\(.value.row)\" \(.value.mean) \(.value.min) \(.value.max)"' \
  "$here"/results/*.json >"$data"
n="$(wc -l <"$data")"
gnuplot <<GP
set terminal svg size 900,420 dynamic background rgb 'white' font 'sans,11'
set output '$out'
set title 'Small quality grid: final validation loss, mean and min-max over 3 seeds (lower is better)'
set ylabel 'validation loss (nats/byte)'
set style fill solid 0.6
set boxwidth 0.6
set xrange [-0.7:$n - 0.3]
set yrange [1.5:4.0]
set grid ytics
set xtics rotate by -25 font ',9'
plot '$data' using 1:3:xtic(2) with boxes lc rgb '#4878a8' notitle, \
     '' using 1:3:4:5 with yerrorbars lc rgb 'black' pt 0 notitle
GP
echo "wrote $out"
