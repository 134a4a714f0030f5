#!/usr/bin/env bash
# Compiles a CUDA source for each architecture with the assembler's resource report and
# fails when any kernel spills registers to local memory (or uses a stack frame).
# Usage: check_no_spills.sh NVCC SOURCE INCLUDE_DIR "ARCH;ARCH..."
set -euo pipefail
nvcc=$1 src=$2 include=$3 archs=$4
status=0
for arch in ${archs//;/ }; do
  arch=${arch%-real}
  arch=${arch%-virtual}
  report=$("$nvcc" -std=c++17 -O3 -I"$include" --expt-relaxed-constexpr -Xptxas -v \
    -gencode "arch=compute_${arch},code=sm_${arch}" -c "$src" -o /dev/null 2>&1)
  kernels=$(grep -c "Compiling entry function" <<<"$report" || true)
  # ptxas prints, per kernel: "N bytes stack frame, N bytes spill stores, N bytes spill loads".
  bad=$(grep -E "[1-9][0-9]* bytes (stack frame|spill stores|spill loads)" <<<"$report" || true)
  echo "sm_${arch}: ${kernels} kernels checked"
  if [[ -n "$bad" ]]; then
    echo "sm_${arch}: register spills or stack use:"
    grep -E "Compiling entry function|stack frame|spill" <<<"$report"
    status=1
  fi
done
if [[ $status -eq 0 ]]; then echo "no spills"; fi
exit $status
