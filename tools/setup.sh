#!/usr/bin/env bash
# geoloco setup: installs every Debian 12 package the project needs (idempotent),
# then configures Release into build/ and builds what the demo needs (the geoloco binary) and
# the Python package (build/python/geoloco: PYTHONPATH=build/python /usr/bin/python3);
# `ctest --test-dir build` builds the tests before it runs them.
#   tools/setup.sh              install (if root and missing) + build the binary and the package
#   GEOLOCO_BUILD_ALL=1 ...     build every target (tests, benchmarks) now
#   GEOLOCO_SKIP_BUILD=1 ...    install only
#   GEOLOCO_BUILD_TYPE=Debug    another build type
#   GEOLOCO_CMAKE_ARGS="..."    extra cmake arguments (e.g. -DGEOLOCO_SANITIZE=address)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

packages=(
  build-essential cmake ninja-build pkg-config clang clang-format libclang-rt-14-dev
  libucx-dev ucx-utils libyaml-cpp-dev libzstd-dev libopenblas-dev libgloo-dev
  libxxhash-dev libssl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev libspdlog-dev
  iproute2 iptables libnetfilter-queue-dev iperf3 jq
  slurm-wlm munge python3-torch python3-numpy gnuplot-nox chromium python3-pil
  prometheus-cpp-dev libcpp-httplib-dev tmux
  pybind11-dev python3-dev python3-pytest
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: missing packages (run as root to install): ${missing[*]}" >&2
    exit 2
  fi
  echo "setup: installing ${#missing[@]} packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [[ "${GEOLOCO_SKIP_BUILD:-0}" == 1 ]]; then exit 0; fi

build_type="${GEOLOCO_BUILD_TYPE:-Release}"
# shellcheck disable=SC2086
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="$build_type" ${GEOLOCO_CMAKE_ARGS:-}
if [[ "${GEOLOCO_BUILD_ALL:-0}" == 1 ]]; then
  cmake --build build -j "$(nproc)"
else
  cmake --build build -j "$(nproc)" --target geoloco geoloco_python
fi
