#!/usr/bin/env bash
# Downloads (here, where Debian's archive is reachable) the .deb files of the libraries
# pagellm builds against, into .gpu-deps/, for a GPU machine that cannot download them:
# scripts/gpu-check.sh unpacks them under /tmp when it finds the folder. Nothing is
# installed here.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(
  libxxhash-dev libxxhash0
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libutf8proc-dev libutf8proc2
  nlohmann-json3-dev
  libcpp-httplib-dev libcpp-httplib0.11 libssl-dev zlib1g-dev libbrotli-dev
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian
  pkgconf pkgconf-bin libpkgconf3
)
mkdir -p .gpu-deps
cd .gpu-deps
apt-get download "${packages[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true
ls *.deb | wc -l | xargs echo "gpu-deps: .deb files in .gpu-deps:"
du -sh . | cut -f1 | xargs echo "gpu-deps: size"
