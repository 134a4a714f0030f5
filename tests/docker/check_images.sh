#!/usr/bin/env bash
# Keeps docker/ true to the build:
# - every shared library BINARY links is installed by the last stage of docker/Dockerfile
#   (but the CUDA ones: that image is built without CUDA) and of docker/Dockerfile.cuda,
#   or comes with the debian:bookworm-slim base;
# - docker/Dockerfile.cuda's CUDA release is the one BINARY was built with;
# - the files docker/compose.yaml names exist, and Prometheus accepts docker/prometheus.yml.
# Usage: check_images.sh BINARY REPO_ROOT. Exits 77 (skipped) off Debian 12, whose
# package names the images use.
set -euo pipefail
binary=$1 root=$2
codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
if [[ $codename != bookworm ]] || ! command -v dpkg-query >/dev/null; then
  echo "not Debian 12 (bookworm), the images' base: skipped"
  exit 77
fi
status=0
fail() {
  echo "FAIL: $*"
  status=1
}

# The words of the apt-get install command in a Dockerfile's last stage that name
# packages, with ${CUDA_RELEASE} replaced by the file's default.
runtime_packages() {
  local file=$1 release
  release=$(sed -n 's/^ARG CUDA_RELEASE=//p' "$file")
  awk '/^FROM /{stage = ""} {stage = stage $0 "\n"} END {printf "%s", stage}' "$file" |
    sed -n '/apt-get install/,/rm -rf/p' | sed "s/\${CUDA_RELEASE}/$release/g" | tr -s ' \t\\' '\n' |
    grep -E '^[a-z0-9][a-z0-9.+-]+$' | grep -vxE 'apt-get|install|rm' | sort -u
}

# A library path from ldd -> the package holding it: a Debian package, or the one of
# NVIDIA's CUDA repository (given the release, as 13-0) for a library of the toolkit.
package_of() {
  local path=$1 release=$2 name
  name=$(basename "$path")
  case $(readlink -f "$path") in
    /usr/local/cuda*)
      case $name in
        libcudart.so.*) echo "cuda-cudart-$release" ;;
        libcublas.so.* | libcublasLt.so.*) echo "libcublas-$release" ;;
        *) echo "unknown-cuda-library:$name" ;;
      esac
      return
      ;;
  esac
  { dpkg-query -S "$path" 2>/dev/null || dpkg-query -S "$(readlink -f "$path")" 2>/dev/null ||
    echo "unowned:$name"; } | head -n 1 | cut -d: -f1
}

base_image="libc6 libgcc-s1 libstdc++6"
cuda_release=$(sed -n 's/^ARG CUDA_RELEASE=//p' "$root/docker/Dockerfile.cuda")
[[ -n $cuda_release ]] || fail "docker/Dockerfile.cuda has no ARG CUDA_RELEASE=..."
cpu_packages=$(runtime_packages "$root/docker/Dockerfile")
cuda_packages=$(runtime_packages "$root/docker/Dockerfile.cuda")

links=$(ldd "$binary")
if grep "not found" <<<"$links"; then fail "$binary links libraries this machine lacks"; fi
libraries=$(awk '$2 == "=>" && $3 ~ /^\// {print $3}' <<<"$links")
[[ -n $libraries ]] || fail "ldd found no libraries in $binary"
for lib in $libraries; do
  package=$(package_of "$lib" "$cuda_release")
  echo "$(basename "$lib") -> $package"
  [[ " $base_image " == *" $package "* ]] && continue
  # A sanitized build's runtimes (make sanitize, make tsan) are no part of an image.
  [[ $package =~ ^lib(a|ub|t|l)san[0-9]+$ ]] && continue
  if ! grep -qx -- "$package" <<<"$cuda_packages"; then
    fail "docker/Dockerfile.cuda does not install $package ($lib)"
  fi
  if [[ $package != cuda-* && $package != libcublas-* ]] && ! grep -qx -- "$package" <<<"$cpu_packages"; then
    fail "docker/Dockerfile does not install $package ($lib)"
  fi
  if [[ $(basename "$lib") == libcudart.so.* ]]; then
    major=${lib##*.so.}
    [[ ${cuda_release%%-*} == "${major%%.*}" ]] ||
      fail "built with CUDA ${major%%.*} (libcudart), but docker/Dockerfile.cuda installs CUDA $cuda_release"
  fi
done

# Files compose.yaml names: the Dockerfiles (relative to the build context, the
# repository root) and the mounted Prometheus config (relative to docker/).
for f in $(sed -n 's/.*dockerfile: *\([^ },]*\).*/\1/p' "$root/docker/compose.yaml"); do
  [[ -f $root/$f ]] || fail "docker/compose.yaml builds $f, which does not exist"
done
for f in $(sed -n 's/^ *- \(\.\/[^:]*\):.*/\1/p' "$root/docker/compose.yaml"); do
  [[ -e $root/docker/$f ]] || fail "docker/compose.yaml mounts $f, which does not exist"
done

if command -v promtool >/dev/null; then
  promtool check config "$root/docker/prometheus.yml" || fail "promtool rejects docker/prometheus.yml"
else
  fail "promtool is missing (scripts/bootstrap.sh installs it)"
fi

[[ $status -eq 0 ]] && echo "docker/ matches the build"
exit $status
