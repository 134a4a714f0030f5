#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds the CUDA backend for that GPU, runs the CUDA
# tests, the decode-attention benchmark and the end-to-end decode benchmark (random
# bf16 weights of Llama 3 8B's shape), and prints a short table. Sized to finish within
# 8 minutes on one H200.
#
#   scripts/gpu-check.sh [OUTDIR]    logs and JSON go to OUTDIR (default: $OUT, else
#                                    gpu-check/)
#
# Libraries come from the system, or, on a machine that cannot download them, from the
# .deb files scripts/gpu-deps.sh put in .gpu-deps/ (unpacked under /tmp, not installed).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu-check}}
mkdir -p "$out"
start=$SECONDS
say() { echo "[gpu-check +$((SECONDS - start))s] $*"; }
fail() {
  say "FAILED: $*"
  exit 1
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem \
  --format=csv,noheader | tee "$out/gpu.txt" || fail "nvidia-smi: no GPU here"
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
[[ -n "$arch" ]] || arch=90

cmake_args=()
if compgen -G ".gpu-deps/*.deb" >/dev/null; then
  deps=/tmp/pagellm-deps
  rm -rf "$deps" && mkdir -p "$deps"
  for f in .gpu-deps/*.deb; do dpkg-deb -x "$f" "$deps" || fail "unpacking $f"; done
  lib=$deps/usr/lib/x86_64-linux-gnu
  export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PKG_CONFIG_LIBDIR=$lib/pkgconfig:$deps/usr/share/pkgconfig
  export PKG_CONFIG_SYSROOT_DIR=$deps PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1
  cmake_args+=("-DCMAKE_PREFIX_PATH=$deps/usr" "-DPKG_CONFIG_EXECUTABLE=$deps/usr/bin/pkgconf")
  say "libraries from .gpu-deps (unpacked in $deps)"
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
say "configure (sm_$arch)"
cmake -S . -B build-gpu "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DPAGELLM_CUDA=ON \
  "-DCMAKE_CUDA_ARCHITECTURES=$arch" "${cmake_args[@]}" >"$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; fail "configure (see configure.log)"; }

targets=(pagellm pagellm_model_bench pagellm_cuda_attention_bench)
for t in tests/cuda/*_test.cpp; do targets+=("$(basename "$t" .cpp)"); done
say "build ${targets[*]}"
timeout 270 cmake --build build-gpu -j "$(nproc)" --target "${targets[@]}" >"$out/build.log" 2>&1 ||
  { grep -E "error|Error" "$out/build.log" | head -30; fail "build (see build.log)"; }

say "CUDA tests"
timeout 120 ctest --test-dir build-gpu -L cuda --output-on-failure --timeout 100 \
  >"$out/tests.log" 2>&1
tests_status=$?
grep -E "tests passed|tests failed|Failed|\*\*\*" "$out/tests.log" | tail -25

say "decode-attention benchmark"
timeout 60 build-gpu/bench/pagellm_cuda_attention_bench --json "$out/attention.json" \
  >"$out/attention.txt" 2>&1 || say "attention benchmark failed (attention.txt)"

say "end-to-end decode benchmark"
timeout 120 build-gpu/bench/pagellm_model_bench --backend cuda --shape llama3-8b \
  --batches 1,32,256 --context 512 --steps 32 --prefill 1024 --json "$out/model.json" \
  >"$out/model.txt" 2>&1 || say "model benchmark failed (model.txt)"

echo
echo "=== GPU: $(cat "$out/gpu.txt")"
echo "=== CUDA tests: $(grep -E "tests passed" "$out/tests.log" || echo "see tests.log")"
echo "=== decode attention (32 query / 8 KV heads of 128, bf16 cache)"
cat "$out/attention.txt"
echo "=== end-to-end decode, Llama 3 8B shape, random bf16 weights, 512-token contexts"
cat "$out/model.txt"
say "done"
exit $tests_status
