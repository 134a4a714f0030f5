#!/usr/bin/env bash
# Installs the Debian packages pagellm needs to build and test, only those missing.
# Safe to run again: when everything is present it does nothing.
set -euo pipefail

# What building the server needs (`scripts/bootstrap.sh --build-only`, as the container
# images do), then what the tests and benchmarks need on top.
packages=(
  cmake ninja-build g++ make pkg-config
  libxxhash-dev          # prefix-cache block hashes
  libpcre2-dev           # tokenizer pre-tokenizer regexes (JIT)
  libutf8proc-dev        # tokenizer NFC normalization
  nlohmann-json3-dev     # JSON: tokenizer.json, configs, the OpenAI protocol
  libcpp-httplib-dev     # HTTP server and client
  libspdlog-dev libfmt-dev
)
test_packages=(
  libgtest-dev libgmock-dev libbenchmark-dev
  libsimde-dev           # the CPU kernel tests of the AVX-512 forms, on machines without it
  prometheus             # promtool checks the /metrics page in the tests
  chromium               # headless browser for the /dashboard test
  python3-numpy          # the lane-level simulation of the tensor-core decode kernel
)
case "${1:-}" in
  --build-only) ;;
  "") packages+=("${test_packages[@]}") ;;
  *) echo "usage: scripts/bootstrap.sh [--build-only]" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "bootstrap: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "bootstrap: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
