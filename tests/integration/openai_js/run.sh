#!/usr/bin/env bash
# Runs client_test.mjs with the official `openai` npm package against a real pagellm.
# The package is installed into the build folder on first use; without node/npm, or
# when the registry cannot be reached, the test is skipped (exit 77).
set -euo pipefail
binary="$1"
work="$2"
here="$(cd "$(dirname "$0")" && pwd)"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "skipped: node and npm are needed for the OpenAI JavaScript client test"
  exit 77
fi
mkdir -p "$work"
if [ ! -d "$work/node_modules/openai" ]; then
  # openai 5 supports the Node.js 20 that Debian ships; 6 and later need newer.
  if ! (cd "$work" && npm install --no-audit --no-fund --silent openai@5 >/dev/null 2>&1); then
    echo "skipped: could not install the openai npm package"
    exit 77
  fi
fi
cp "$here/client_test.mjs" "$work/"

model="$work/tiny-model"
if ! grep -q get_weather "$model/tokenizer.json" 2>/dev/null; then
  rm -rf "$model" "$model.tmp"
  "$binary" demo-model "$model.tmp" --preset tiny >/dev/null
  # The unused token <|pad|> (511) decodes to a whole tool call, and the template teaches
  # the <tool_call> syntax: with logit_bias the model then calls a tool.
  node - "$model.tmp" <<'JS'
const fs = require('fs');
const dir = process.argv[2];
const call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';
const tokenizer = JSON.parse(fs.readFileSync(`${dir}/tokenizer.json`));
for (const t of tokenizer.added_tokens) if (t.id === 511) Object.assign(t, { content: call, special: false });
fs.writeFileSync(`${dir}/tokenizer.json`, JSON.stringify(tokenizer));
const config = JSON.parse(fs.readFileSync(`${dir}/tokenizer_config.json`));
Object.assign(config.added_tokens_decoder['511'], { content: call, special: false });
config.chat_template = '{% if tools %}Tools: {{ tools | tojson }}. Call one in <tool_call></tool_call>.{% endif %}' +
  config.chat_template;
fs.writeFileSync(`${dir}/tokenizer_config.json`, JSON.stringify(config));
JS
  mv "$model.tmp" "$model"
fi
log="$work/server.log"
"$binary" serve --model "$model" --port 0 --served-model-name tiny >"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
url=""
for _ in $(seq 1 200); do
  url=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -n 1 || true)
  [ -n "$url" ] && break
  kill -0 "$server" 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.05
done
[ -n "$url" ] || { echo "the server did not start"; cat "$log"; exit 1; }
node "$work/client_test.mjs" "$url/v1" tiny
