#!/usr/bin/env bash
# The report as a person sees it: a two-site run (or the run directory given), its report
# opened in headless Chromium. Checks: no console error or failed load; every figure renders
# (a screenshot of each figure alone has ink in its plot area); the loss figure's first
# series has exactly one marker per step logged in the first site's metrics.jsonl.
#   report_in_chromium.sh BUILD_DIR [RUN_DIR]
#   GEOLOCO_REPORT_SCREENSHOT=FILE  also writes a screenshot of the top of the report there
#                                   (README's picture: made with the demo's run directory)
set -euo pipefail
build="$(readlink -f "$1")"
run="${2:-}"
here="$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")"
tmp="$(mktemp -d /tmp/geoloco-report-chromium-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "report_in_chromium: FAIL: $*" >&2; exit 1; }

browser="$(command -v chromium || true)"
[[ -n "$browser" ]] || fail "chromium not found (tools/setup.sh installs Debian's chromium)"
py=/usr/bin/python3  # Debian's Python: PIL (python3-pil)

if [[ -z "$run" ]]; then
  # shellcheck source=../../support/ports.sh
  source "$here/../../support/ports.sh"
  geoloco_claim_ports || fail "no free port block"
  port=$GEOLOCO_PORT_BASE
  printf '0123456789abcdef-test-key' > "$tmp/k.psk"
  cat > "$tmp/c.yaml" <<YAML
run: {name: chromium-check, seed: 7, output_dir: $tmp/out}
model: {n_layer: 1, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 64}
data:
  train: {kind: synthetic, vocab: 64, branching: 3, seed: 5}
train: {steps: 30, micro_batch: 2, log_every: 2, eval_every: 10, checkpoint_every: 15}
outer: {interval: 5, compression: {codec: int4, error_feedback: true}}
sites:
  - {name: paris, ranks: 2, port: $port}
  - {name: lyon, ranks: 2, port: $((port + 10))}
transport: {psk_file: k.psk, connect_timeout_s: 20}
YAML
  "$build/geoloco" launch "$tmp/c.yaml" > "$tmp/launch.log" 2>&1 || { cat "$tmp/launch.log"; fail "the run failed"; }
  run="$tmp/out"
fi

"$build/geoloco" report "$run" -o "$tmp/report.html" > "$tmp/report.log" 2>&1 ||
  { cat "$tmp/report.log"; fail "geoloco report failed"; }

chrome() {  # chrome OUTPUT_FLAG... URL ; console and errors to $tmp/console.log (appended)
  # --no-sandbox: CI runs as root. A fresh profile per call; no network is needed or used.
  timeout 60 "$browser" --headless=new --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
    --user-data-dir="$tmp/profile" --enable-logging=stderr --v=0 "$@" 2>> "$tmp/console.log"
}

# 1. The page as parsed by the browser.
chrome --dump-dom "file://$tmp/report.html" > "$tmp/dom.html"
[[ -s "$tmp/dom.html" ]] || fail "chromium produced no DOM"

# 2. Each figure alone, screenshotted.
"$py" - "$tmp" <<'PY'
import re, sys, pathlib
tmp = pathlib.Path(sys.argv[1])
html = (tmp / "report.html").read_text()
style = re.search(r"<style>(.*?)</style>", html, re.S).group(1)
figs = re.findall(r'(<section class="figure" id="([^"]+)".*?</section>)', html, re.S)
for body, fid in figs:
    (tmp / f"fig_{fid}.html").write_text(
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><style>{style} body{{margin:0;max-width:1000px}}'
        f' h2,p{{display:none}}</style></head><body>{body}</body></html>')
print(len(figs))
PY
for f in "$tmp"/fig_*.html; do
  chrome --window-size=1000,480 --screenshot="${f%.html}.png" "file://$f" > /dev/null
done
if [[ -n "${GEOLOCO_REPORT_SCREENSHOT:-}" ]]; then
  chrome --window-size=1100,1500 --screenshot="$GEOLOCO_REPORT_SCREENSHOT" "file://$tmp/report.html" > /dev/null
fi

# 3. The checks.
"$py" - "$tmp" "$run" <<'PY'
import json, re, sys, pathlib
from PIL import Image
tmp, run = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
errors = []
console = (tmp / "console.log").read_text(errors="replace")
for line in console.splitlines():
    if "CONSOLE" in line or "Failed to load resource" in line or "Uncaught" in line:
        errors.append("console: " + line.strip())
dom = (tmp / "dom.html").read_text()
figs = re.findall(r'<section class="figure" id="([^"]+)"', dom)
if len(figs) < 8:
    errors.append(f"only {len(figs)} figures in the page: {figs}")
# Every figure's screenshot has ink in its plot area (not one flat colour).
for fid in figs:
    png = tmp / f"fig_{fid}.png"
    if not png.exists():
        errors.append(f"{fid}: no screenshot"); continue
    im = Image.open(png).convert("RGB")
    w, h = im.size
    area = im.crop((int(w * 0.08), int(h * 0.1), int(w * 0.7), int(h * 0.85)))
    px = list(area.getdata())
    ink = sum(1 for p in px if sum(p) < 600) / len(px)
    colours = len(set(px))
    if ink < 0.003 or colours < 4:
        errors.append(f"{fid}: figure area looks blank (ink {ink:.4f}, {colours} colours)")
# The loss figure: markers of series 1 = logged steps of the first site.
sec = re.search(r'<section class="figure" id="loss_step".*?</section>', dom, re.S)
if not sec:
    errors.append("no loss_step figure")
else:
    body = sec.group(0)
    g = re.search(r'id="[^"]*gnuplot_plot_1"(.*?)id="[^"]*gnuplot_plot_2"', body, re.S)
    markers = len(re.findall(r"<use", g.group(1))) - 1 if g else -1  # less the key's sample
    sites = [l for l in (run / "config.yaml").read_text().splitlines()] if (run / "config.yaml").exists() else []
    first = re.search(r"name:\s*([A-Za-z0-9_.-]+)", "\n".join(s for s in sites if s.strip().startswith("-")))
    site = first.group(1) if first else sorted(p.name for p in (run / "sites").iterdir())[0]
    steps = set()
    for line in (run / "sites" / site / "metrics.jsonl").read_text().splitlines():
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if "loss" in j: steps.add(j["step"])
    if markers != len(steps):
        errors.append(f"loss figure: {markers} markers for {site}, {len(steps)} logged steps")
    else:
        print(f"report_in_chromium: loss series of {site}: {markers} markers = {len(steps)} logged steps")
if errors:
    print("\n".join(errors)); sys.exit(1)
print(f"report_in_chromium: {len(figs)} figures render, no console errors")
PY
