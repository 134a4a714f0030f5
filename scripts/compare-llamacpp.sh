#!/usr/bin/env bash
# pagellm against llama.cpp on this machine: the same model (models/bench, written as GGUF
# by scripts/hf_to_gguf.py: 16-bit weights, f16 by default for llama.cpp, which runs them
# faster here than bf16), the same threads, in alternating rounds, so that both see the
# same memory bandwidth. Prints medians over the rounds:
#   engines  llama-bench (pp512, tg128) and llama-batched-bench (64-token prompts, 32
#            tokens at 1, 8 and 16 sequences) against pagellm_model_bench
#   servers  llama-server (16 slots) and pagellm serve under `pagellm bench`: unique
#            64-token prompts, 32 output tokens, streaming, at 1, 8 and 16 users
#
#   scripts/compare-llamacpp.sh [OUTDIR]      ROUNDS=3 THREADS=2 LLAMACPP_WEIGHTS=f16|bf16
#
# llama.cpp's source comes from the npm registry: the node-llama-cpp package carries it as
# a git bundle (tag in its llama/llama.cpp.info.json). It is built once, CPU only, for
# this machine (-march=native), in .llamacpp/. Needs node and npm, cmake and ninja, and
# pagellm built (make build). 3 rounds take about 6 minutes on 2 cores; the first build of
# llama.cpp about 12 more.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=$(realpath -m "${1:-compare-llamacpp}")
rounds=${ROUNDS:-3}
threads=${THREADS:-2}
node_llama_cpp=${NODE_LLAMA_CPP:-3.22.1}
cache=$root/.llamacpp
mkdir -p "$out" "$cache"
say() { echo "[compare] $*" >&2; }

bin=$cache/llama.cpp/build/bin
if [[ ! -x $bin/llama-server || ! -x $bin/llama-bench || ! -x $bin/llama-batched-bench ]]; then
  say "fetching llama.cpp's source (node-llama-cpp@$node_llama_cpp on npm)"
  (cd "$cache" && rm -rf package llama.cpp && npm pack --silent "node-llama-cpp@$node_llama_cpp" >/dev/null &&
    tar -xzf "node-llama-cpp-$node_llama_cpp.tgz" package/llama/gitRelease.bundle \
      package/llama/llama.cpp.info.json &&
    git -c advice.detachedHead=false clone -q package/llama/gitRelease.bundle llama.cpp)
  say "building llama.cpp $(grep -o '"tag": *"[^"]*"' "$cache/package/llama/llama.cpp.info.json")"
  cmake -S "$cache/llama.cpp" -B "$cache/llama.cpp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF >"$out/llamacpp-build.log" 2>&1
  ninja -C "$cache/llama.cpp/build" llama-bench llama-batched-bench llama-server \
    >>"$out/llamacpp-build.log" 2>&1
fi
[[ -x build/pagellm && -x build/bench/pagellm_model_bench ]] || {
  echo "build pagellm first (make build)" >&2
  exit 1
}
[[ -f models/bench/config.json ]] || build/pagellm demo-model models/bench --preset bench
weights=${LLAMACPP_WEIGHTS:-f16}
gguf=$cache/bench-$weights.gguf
python3 scripts/hf_to_gguf.py models/bench "$gguf" $([[ $weights == f16 ]] && echo --f16) >&2

port=$((20000 + RANDOM % 20000))
server_pid=
stop_server() {
  if [[ -n "$server_pid" ]]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=
  fi
}
trap stop_server EXIT
wait_ready() {
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && return 0
    sleep 0.2
  done
  echo "the server on port $port did not start" >&2
  return 1
}
serve() {  # serve llama|pagellm
  if [[ $1 == llama ]]; then
    "$bin/llama-server" -m "$gguf" -t "$threads" -np 16 -c 4096 --port "$port" \
      >"$out/server-llama.log" 2>&1 &
  else
    OMP_NUM_THREADS=$threads build/pagellm serve --model models/bench --port "$port" \
      >"$out/server-pagellm.log" 2>&1 &
  fi
  server_pid=$!
  wait_ready
}

for r in $(seq "$rounds"); do
  say "round $r of $rounds: engines"
  "$bin/llama-bench" -m "$gguf" -t "$threads" -p 512 -n 128 -r 3 -o json \
    >"$out/llama-bench-$r.json" 2>/dev/null
  "$bin/llama-batched-bench" -m "$gguf" -t "$threads" -c 4096 -npp 64 -ntg 32 -npl 1,8,16 \
    --output-format jsonl 2>/dev/null | grep '^{' >"$out/llama-batched-$r.jsonl"
  OMP_NUM_THREADS=$threads build/bench/pagellm_model_bench --model models/bench \
    --batches 1,8,16 --steps 64 --prefill 512 --json "$out/pagellm-model-$r.json" >/dev/null
  for engine in llama pagellm; do
    say "round $r of $rounds: $engine server"
    serve "$engine"
    for users in 1 8 16; do
      requests=$((users == 1 ? 16 : 64))
      build/pagellm bench --url "http://127.0.0.1:$port" --concurrency "$users" \
        --num-requests "$requests" --input-len 64 --output-len 32 --warmup "$((users / 2 + 2))" \
        --seed "$((100 * r + users))" --no-progress --json "$out/serve-$engine-$users-$r.json" >/dev/null ||
        say "$engine at $users users: some requests failed (see the JSON)"
    done
    stop_server
  done
done

python3 - "$out" "$rounds" "$weights" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
med = lambda xs: statistics.median(xs) if xs else float("nan")
def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None
rows = []
def row(what, llama, ours):
    l, o = med(llama), med(ours)
    rows.append((what, l, o, o / l if l == l and l > 0 else float("nan")))
lb = [load(f"{out}/llama-bench-{r}.json") or [] for r in range(1, rounds + 1)]
pm = [load(f"{out}/pagellm-model-{r}.json") for r in range(1, rounds + 1)]
pm = [p for p in pm if p]
batched = []
for r in range(1, rounds + 1):
    try:
        batched.append([json.loads(l) for l in open(f"{out}/llama-batched-{r}.jsonl") if l.strip()])
    except (OSError, ValueError):
        pass
row("prefill, 512-token prompt (tok/s)", [x["avg_ts"] for b in lb for x in b if x["n_prompt"] == 512],
    [p["prefill_tokens_per_s"] for p in pm])
row("decode batch 1 (tok/s)", [x["avg_ts"] for b in lb for x in b if x["n_gen"] == 128],
    [d["tokens_per_s"] for p in pm for d in p["decode"] if d["batch"] == 1])
for n in (8, 16):
    row(f"decode batch {n} (tok/s)", [x["speed_tg"] for b in batched for x in b if x["pl"] == n],
        [d["tokens_per_s"] for p in pm for d in p["decode"] if d["batch"] == n])
for users in (1, 8, 16):
    get = lambda e: [j["output_throughput"] for r in range(1, rounds + 1)
                     if (j := load(f"{out}/serve-{e}-{users}-{r}.json")) and j.get("failed") == 0]
    row(f"server, {users} users (output tok/s)", get("llama"), get("pagellm"))
for users in (1, 16):
    get = lambda e: [j["ttft_ms"]["median"] for r in range(1, rounds + 1)
                     if (j := load(f"{out}/serve-{e}-{users}-{r}.json")) and j.get("failed") == 0]
    row(f"server, {users} users: median TTFT (ms)", get("llama"), get("pagellm"))
bw = [p["copy_bandwidth_gbs"] for p in pm]
print(f"medians of {rounds} rounds; llama.cpp with {sys.argv[3]} weights, pagellm with the "
      f"model's bf16; copy bandwidth {min(bw, default=0):.1f} to {max(bw, default=0):.1f} GB/s")
print(f"{'':40} {'llama.cpp':>10} {'pagellm':>10} {'ratio':>7}")
for what, l, o, ratio in rows:
    print(f"{what:40} {l:10.1f} {o:10.1f} {ratio:7.2f}")
EOF
