#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: gets the CUDA programs (built here, or unpacked from
# a pack made elsewhere by scripts/gpu-pack.sh), runs the CUDA tests, the
# decode-attention benchmark, the sampling benchmark and the end-to-end decode benchmark
# (random bf16 weights of Llama 3 8B's shape), and prints a short table. With packed programs it took under a
# minute on one H200; building there adds up to 5 minutes.
#
#   scripts/gpu-check.sh [OUTDIR]    logs and JSON go to OUTDIR (default: $OUT, else
#                                    gpu-check/); at most 8 files
#
# Programs: from .gpu-prebuilt/prebuilt.tar.xz when it is there and its programs find
# every library they need (PAGELLM_GPU_BUILD=1 skips it); else built here, in
# build-gpu/, for this GPU's architecture. Libraries for that build come from the system
# or, on a machine that cannot download them, from the .deb files scripts/gpu-deps.sh
# put in .gpu-deps/ (unpacked under /tmp, not installed).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${1:-${OUT:-gpu-check}}
mkdir -p "$out"
out=$(realpath "$out")
start=$SECONDS
say() { echo "[gpu-check +$((SECONDS - start))s] $*"; }
fail() {
  say "FAILED: $*"
  exit 1
}

info=$out/info.txt
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem \
  --format=csv,noheader >"$out/gpu.txt" || fail "nvidia-smi: no GPU here"
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
[[ -n "$arch" ]] || arch=90
{
  cat "$out/gpu.txt"
  grep PRETTY_NAME /etc/os-release
  ldd --version | head -1
  command -v nvcc >/dev/null && nvcc --version | tail -1
  command -v g++ >/dev/null && g++ --version | head -1
  command -v cmake >/dev/null && cmake --version | head -1
  echo "cores: $(nproc)"
} >"$info" 2>&1

# CUDA's runtime and cuBLAS: the loader's, else the toolkit's or a Python package's.
cuda_dirs=()
for name in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
  ldconfig -p | grep -q "$name " && continue
  found=$(find /usr/local/cuda/ /usr/local/cuda-*/ /usr/lib/x86_64-linux-gnu/ /opt/ \
    -name "$name" 2>/dev/null | head -1)
  [[ -n "$found" ]] && cuda_dirs+=("$(dirname "$found")")
done
for d in "${cuda_dirs[@]}"; do
  export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done

# The programs' libraries all found? Prints what is missing.
missing_libs() { for p in "$@"; do ldd "$p" 2>&1; done | grep "not found" | sort -u; }

bin=
tests=(cuda_attention_test cuda_kernels_test cuda_blas_test cuda_sampling_test
  cuda_backend_test cuda_server_test)
if [[ -f .gpu-prebuilt/prebuilt.tar.xz && "${PAGELLM_GPU_BUILD:-0}" != 1 ]]; then
  pre=/tmp/pagellm-prebuilt
  rm -rf "$pre" && mkdir -p "$pre" && tar -xJf .gpu-prebuilt/prebuilt.tar.xz -C "$pre"
  export LD_LIBRARY_PATH=$pre/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  programs=("$pre"/build/pagellm "$pre"/build/bench/* "$pre"/build/tests/*)
  if [[ -n "$(missing_libs "${programs[@]}")" ]]; then
    export LD_LIBRARY_PATH=$pre/lib/fallback:$LD_LIBRARY_PATH
  fi
  missing=$(missing_libs "${programs[@]}")
  if [[ -z "$missing" ]] && "$pre/build/pagellm" --help >/dev/null 2>&1; then
    # The test programs start the server through the path they were built with.
    built_at=$(cat "$pre/build-dir")
    if [[ ! -e "$built_at" ]]; then
      mkdir -p "$(dirname "$built_at")" && ln -s "$pre/build" "$built_at"
    fi
    [[ "$(realpath "$built_at/pagellm" 2>/dev/null)" == "$pre/build/pagellm" ]] ||
      say "warning: $built_at/pagellm is not the packed server; the server test starts that one"
    bin=$pre/build
    say "programs from .gpu-prebuilt (built at $built_at)"
  else
    say "the packed programs cannot run here; building instead"
    echo "prebuilt: missing libraries: $missing" >>"$info"
  fi
fi

if [[ -z "$bin" ]]; then
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
    "-DCMAKE_CUDA_ARCHITECTURES=$arch" "${cmake_args[@]}" >"$out/build.log" 2>&1 ||
    { tail -30 "$out/build.log"; fail "configure (see build.log)"; }
  say "build"
  timeout 270 cmake --build build-gpu -j "$(nproc)" --target pagellm pagellm_model_bench \
    pagellm_cuda_attention_bench pagellm_cuda_sampling_bench "${tests[@]}" >>"$out/build.log" 2>&1 ||
    { grep -E "error|Error" "$out/build.log" | head -30; fail "build (see build.log)"; }
  bin=$root/build-gpu
fi

# The CUDA test programs at once (they share the GPU; their CPU references share the
# cores), each under its own time limit. The attention tests run twice: decode on tensor
# cores (the default) and on CUDA cores.
say "CUDA tests"
runs=("${tests[@]}" "cuda_attention_test PAGELLM_DECODE_MMA=0")
export OMP_NUM_THREADS=$(($(nproc) / 4 > 0 ? $(nproc) / 4 : 1))
for run in "${runs[@]}"; do
  read -r t setting <<<"$run"
  log=/tmp/pagellm-$t${setting:+-cuda-cores}.log
  (env $setting timeout 150 "$bin/tests/$t" --gtest_color=no >"$log" 2>&1
    echo "exit status $?" >>"$log") &
done
wait
unset OMP_NUM_THREADS
tests_status=0
: >"$out/tests.log"
: >"$out/tests-summary.txt"
for run in "${runs[@]}"; do
  read -r t setting <<<"$run"
  log=/tmp/pagellm-$t${setting:+-cuda-cores}.log
  t=$t${setting:+ ($setting)}
  { echo "===== $t"; cat "$log"; } >>"$out/tests.log"
  passed=$(grep -oE "^\[  PASSED  \] [0-9]+" "$log" | grep -oE "[0-9]+$" || echo 0)
  skipped=$(grep -oE "^\[  SKIPPED \] [0-9]+ test" "$log" | grep -oE "[0-9]+" || echo 0)
  failed=$(grep -oE "^\[  FAILED  \] [0-9]+ test" "$log" | grep -oE "[0-9]+" || echo 0)
  status=$(tail -1 "$log")
  [[ "$status" == "exit status 0" ]] || tests_status=1
  printf "%-44s passed %3s  skipped %3s  failed %3s  (%s)\n" "$t" "$passed" "$skipped" \
    "$failed" "$status" | tee -a "$out/tests-summary.txt"
  grep -E "^\[  FAILED  \] [A-Za-z]" "$log" | sort -u | head -20
done

say "decode-attention benchmark"
timeout 90 "$bin/bench/pagellm_cuda_attention_bench" --json "$out/attention.json" \
  >"$out/bench.txt" 2>&1 || say "attention benchmark failed (bench.txt)"
# The same kernel held to 4 blocks a multiprocessor, as many as fit before its q pieces
# kept only the group's rows: what the fifth block is worth.
{
  echo
  echo "--- PAGELLM_DECODE_MAX_BLOCKS_PER_SM=4"
  PAGELLM_DECODE_MAX_BLOCKS_PER_SM=4 timeout 90 "$bin/bench/pagellm_cuda_attention_bench" ||
    echo "attention benchmark (4 blocks) failed"
  # Partitions of 7, 6 and 5 tiles beside the powers of two the kernel picks: at 16 x 4k,
  # 512 tokens make 1024 blocks, about 1.6 times what the GPU runs at once, and 448
  # about 1.9 times; where the last, partly filled round of blocks costs time, a length
  # that fills it does better.
  echo
  echo "--- partition lengths"
  timeout 90 "$bin/bench/pagellm_cuda_attention_bench" --shapes 16x4096,64x1024,256x2048 \
    --partitions 512,448,384,320,256 || echo "attention benchmark (partition lengths) failed"
} >>"$out/bench.txt" 2>&1

say "sampling benchmark"
{
  echo
  timeout 60 "$bin/bench/pagellm_cuda_sampling_bench" || echo "sampling benchmark failed"
} >>"$out/bench.txt" 2>&1

say "end-to-end decode benchmark"
{
  echo
  timeout 150 "$bin/bench/pagellm_model_bench" --backend cuda --shape llama3-8b \
    --batches 1,32,256 --context 512 --steps 32 --prefill 1024 --json "$out/model.json" ||
    echo "model benchmark failed"
} >>"$out/bench.txt" 2>&1

echo
echo "=== GPU: $(cat "$out/gpu.txt")"
echo "=== CUDA tests"
cat "$out/tests-summary.txt"
echo "=== benchmarks: decode attention (32 query / 8 KV heads of 128, bf16 cache), drawing"
echo "    tokens (128k vocabulary), then end-to-end decode, Llama 3 8B shape, random bf16"
echo "    weights, 512-token contexts"
cat "$out/bench.txt"
say "done"
exit $tests_status
