#include "server/dashboard.h"

namespace pagellm::server {

const char* dashboard_html() {
  return R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>pagellm dashboard</title>
<style>
  body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; }
  h1 { font-size: 18px; }
  .row { display: flex; gap: 24px; flex-wrap: wrap; margin-bottom: 16px; }
  .card { border: 1px solid #ddd; border-radius: 6px; padding: 10px 14px; min-width: 120px; }
  .card b { display: block; font-size: 22px; }
  #pool { display: grid; grid-template-columns: repeat(64, 10px); gap: 1px; }
  #pool div { width: 10px; height: 10px; }
  .used { background: #d9534f; } .cached { background: #f0ad4e; } .free { background: #e6e6e6; }
  .legend span { display: inline-block; width: 10px; height: 10px; margin: 0 4px 0 12px; }
  #error { color: #b00; }
</style>
</head>
<body>
<h1>pagellm: KV block pool</h1>
<div class="row" id="cards"></div>
<div class="legend"><span class="used"></span>used <span class="cached"></span>cached-free
  (prefix blocks, reclaimable) <span class="free"></span>free</div>
<p id="summary"></p>
<div id="pool"></div>
<p id="error"></p>
<script>
// The pool as counts, drawn in order: which block is which does not matter here.
const maxCells = 4096;
let last = null;
function headers() {
  const key = sessionStorage.getItem('pagellm-key');
  return key ? { 'Authorization': 'Bearer ' + key } : {};
}
function card(label, value) {
  return '<div class="card">' + label + '<b>' + value + '</b></div>';
}
async function poll() {
  try {
    const res = await fetch('/v1/stats', { headers: headers() });
    if (res.status === 401) {
      const key = prompt('API key');
      if (key) sessionStorage.setItem('pagellm-key', key);
      return;
    }
    const s = await res.json();
    const now = performance.now() / 1000;
    let rate = '-';
    if (last) {
      const dt = now - last.t;
      rate = ((s.scheduler.generation_tokens - last.s.scheduler.generation_tokens) / dt).toFixed(0);
    }
    last = { t: now, s: s };
    const kv = s.kv_cache;
    document.getElementById('cards').innerHTML =
      card('running', s.num_requests_running) + card('waiting', s.num_requests_waiting) +
      card('KV usage', (100 * kv.usage).toFixed(1) + '%') + card('tokens/s', rate) +
      card('prefix hit rate', (100 * kv.prefix_hit_rate).toFixed(1) + '%') +
      card('preemptions', s.scheduler.num_preemptions);
    const scale = Math.max(1, Math.ceil(kv.total_blocks / maxCells));
    document.getElementById('summary').textContent =
      kv.total_blocks + ' blocks of 16 tokens: ' + kv.used_blocks + ' used, ' +
      kv.cached_free_blocks + ' cached-free, ' + kv.free_blocks + ' free' +
      (scale > 1 ? ' (one square = ' + scale + ' blocks)' : '');
    const cells = Math.ceil(kv.total_blocks / scale);
    const used = Math.round(kv.used_blocks / scale);
    const cached = Math.round(kv.cached_free_blocks / scale);
    let html = '';
    for (let i = 0; i < cells; ++i) {
      html += '<div class="' + (i < used ? 'used' : i < used + cached ? 'cached' : 'free') + '"></div>';
    }
    document.getElementById('pool').innerHTML = html;
    document.getElementById('error').textContent = '';
  } catch (e) {
    document.getElementById('error').textContent = 'server unreachable: ' + e;
  }
}
poll();
setInterval(poll, 500);
</script>
</body>
</html>
)html";
}

}  // namespace pagellm::server
