#!/usr/bin/env bash
# Packs, from a build here, what scripts/gpu-check.sh needs to run on a GPU machine
# without building there: the stripped server, the model benchmark, the two kernel
# benchmarks (attention, sampling) and the CUDA test programs, laid out as in the build
# folder, plus the shared libraries they load other than the C library and CUDA's (which
# the GPU machine has). The pack is one xz-compressed tar, .gpu-prebuilt/prebuilt.tar.xz
# (ignored by git): about 14 MB. The build must hold machine code for that GPU
# (CMAKE_CUDA_ARCHITECTURES; the default build has sm_80 and sm_90).
#
#   scripts/gpu-pack.sh [BUILD_DIR]    default: build
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:-build}")
out=.gpu-prebuilt
pack=$(mktemp -d)
trap 'rm -rf "$pack"' EXIT
programs=(pagellm bench/pagellm_model_bench bench/pagellm_cuda_attention_bench
  bench/pagellm_cuda_sampling_bench)
for t in tests/cuda/*_test.cpp; do programs+=("tests/$(basename "$t" .cpp)"); done

mkdir -p "$pack/build" "$pack/lib"
for p in "${programs[@]}"; do
  [[ -x "$build/$p" ]] || {
    echo "gpu-pack: $build/$p is missing: build it first" >&2
    exit 1
  }
  mkdir -p "$pack/build/$(dirname "$p")"
  strip -o "$pack/build/$p" "$build/$p"
done
# The test programs reach the server binary through the absolute path they were built
# with; gpu-check.sh recreates that path.
echo "$build" >"$pack/build-dir"

# Libraries: everything the programs load except the C library's own and CUDA's. The
# C++ runtime goes to lib/fallback: gpu-check.sh uses it only where the GPU machine's
# own is too old.
mkdir -p "$pack/lib/fallback"
for p in "${programs[@]}"; do ldd "$build/$p"; done |
  awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    case "$name" in
    libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | libcuda.so* | \
      libcudart.so* | libcublas*) ;;
    libstdc++.so* | libgcc_s.so*) cp -L "$path" "$pack/lib/fallback/$name" ;;
    *) cp -L "$path" "$pack/lib/$name" ;;
    esac
  done
rm -rf "$out" && mkdir -p "$out"
XZ_OPT=-T0 tar -cJf "$out/prebuilt.tar.xz" -C "$pack" .
echo "gpu-pack: ${#programs[@]} programs, $(find "$pack/lib" -type f | wc -l) libraries," \
  "$(du -sh "$out/prebuilt.tar.xz" | cut -f1) in $out/prebuilt.tar.xz"
