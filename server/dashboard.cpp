#include "server/dashboard.h"

namespace pagellm::server {

// One self-contained page: no external assets. It polls /v1/stats twice a second. The
// pool is drawn one pixel per block into a canvas scaled up with CSS, so 100,000
// blocks cost one putImageData per poll, not 100,000 DOM nodes.
const char* dashboard_html() {
  return R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>pagellm dashboard</title>
<style>
  body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; }
  h1 { font-size: 18px; } h2 { font-size: 15px; margin: 18px 0 6px; }
  .row { display: flex; gap: 16px; flex-wrap: wrap; margin-bottom: 12px; }
  .card { border: 1px solid #ddd; border-radius: 6px; padding: 10px 14px; min-width: 110px; }
  .card b { display: block; font-size: 22px; }
  #pool { image-rendering: pixelated; border: 1px solid #ccc; width: 640px; }
  canvas.chart { border: 1px solid #ddd; width: 420px; height: 120px; }
  .legend i { display: inline-block; width: 10px; height: 10px; margin: 0 4px 0 12px; }
  #error { color: #b00; }
</style>
</head>
<body>
<h1>pagellm: KV block pool</h1>
<div class="row" id="cards"></div>
<div class="legend">
  <i style="background:#16a34a"></i>used <b id="count-used">0</b>
  <i style="background:#9333ea"></i>shared <b id="count-shared">0</b>
  <i style="background:#60a5fa"></i>cached-free (reclaimable prefix) <b id="count-cached">0</b>
  <i style="background:#e5e7eb"></i>free <b id="count-free">0</b>
</div>
<p id="summary"></p>
<canvas id="pool" width="1" height="1"></canvas>
<div class="row">
  <div><h2>occupancy (used, and used + cached-free)</h2><canvas class="chart" id="occupancy" width="420" height="120" data-points="0"></canvas></div>
  <div><h2>requests (running, waiting)</h2><canvas class="chart" id="requests" width="420" height="120" data-points="0"></canvas></div>
  <div><h2>generated tokens/s</h2><canvas class="chart" id="rate" width="420" height="120" data-points="0"></canvas></div>
</div>
<p id="error"></p>
<script>
const colors = { u: [22, 163, 74], s: [147, 51, 234], c: [96, 165, 250], '.': [229, 231, 235] };
const history = { occupancy: [], requests: [], rate: [] };
const keep = 240;  // two minutes of polls
// Tokens/s is averaged over the polls of the last few seconds: a single 500 ms interval
// can fall between two steps of a busy engine and read 0.
const rateWindow = 4;  // seconds
let samples = [];      // {t, tokens}, oldest first
function headers() {
  const key = sessionStorage.getItem('pagellm-key');
  return key ? { 'Authorization': 'Bearer ' + key } : {};
}
function card(label, value) {
  return '<div class="card">' + label + '<b>' + value + '</b></div>';
}
function drawPool(map) {
  const canvas = document.getElementById('pool');
  const cols = Math.max(1, Math.ceil(Math.sqrt(map.length * 2)));
  const rows = Math.max(1, Math.ceil(map.length / cols));
  if (canvas.width !== cols || canvas.height !== rows) {
    canvas.width = cols;
    canvas.height = rows;
    canvas.style.height = Math.round(640 * rows / cols) + 'px';
  }
  const ctx = canvas.getContext('2d');
  const image = ctx.createImageData(cols, rows);
  const counts = { u: 0, s: 0, c: 0, '.': 0 };
  for (let i = 0; i < map.length; ++i) {
    const state = map[i];
    counts[state] = (counts[state] || 0) + 1;
    const rgb = colors[state] || colors['.'];
    image.data[4 * i] = rgb[0]; image.data[4 * i + 1] = rgb[1];
    image.data[4 * i + 2] = rgb[2]; image.data[4 * i + 3] = 255;
  }
  ctx.putImageData(image, 0, 0);
  document.getElementById('count-used').textContent = counts.u;
  document.getElementById('count-shared').textContent = counts.s;
  document.getElementById('count-cached').textContent = counts.c;
  document.getElementById('count-free').textContent = counts['.'];
}
// Line chart of the series in `points` (arrays of numbers), scaled to `top`.
function drawChart(id, points, top, styles) {
  const canvas = document.getElementById(id);
  const ctx = canvas.getContext('2d');
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  canvas.dataset.points = points.length;
  if (points.length < 2) return;
  const scale = top > 0 ? top : 1;
  styles.forEach((style, k) => {
    ctx.strokeStyle = style;
    ctx.beginPath();
    points.forEach((p, i) => {
      const x = i * (canvas.width - 1) / (keep - 1);
      const y = canvas.height - 2 - p[k] / scale * (canvas.height - 4);
      i ? ctx.lineTo(x, y) : ctx.moveTo(x, y);
    });
    ctx.stroke();
  });
}
function push(series, value) {
  series.push(value);
  if (series.length > keep) series.shift();
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
    const tokens = s.scheduler.generation_tokens;
    // A restarted server counts from 0 again.
    if (samples.length && tokens < samples[samples.length - 1].tokens) samples = [];
    samples.push({ t: now, tokens: tokens });
    while (samples.length > 2 && now - samples[1].t >= rateWindow) samples.shift();
    const first = samples[0];
    const rate = now > first.t ? (tokens - first.tokens) / (now - first.t) : 0;
    const kv = s.kv_cache;
    document.getElementById('cards').innerHTML =
      card('running', s.num_requests_running) + card('waiting', s.num_requests_waiting) +
      card('KV usage', (100 * kv.usage).toFixed(1) + '%') + card('tokens/s', rate.toFixed(0)) +
      card('prefix hit rate', (100 * kv.prefix_hit_rate).toFixed(1) + '%') +
      card('preemptions', s.scheduler.num_preemptions);
    document.getElementById('summary').textContent =
      kv.total_blocks + ' blocks of 16 tokens: ' + kv.used_blocks + ' used, ' +
      kv.cached_free_blocks + ' cached-free, ' + kv.free_blocks + ' free';
    drawPool(s.block_map || '');
    push(history.occupancy, [kv.used_blocks, kv.used_blocks + kv.cached_free_blocks]);
    push(history.requests, [s.num_requests_running, s.num_requests_waiting]);
    push(history.rate, [rate]);
    drawChart('occupancy', history.occupancy, kv.total_blocks, ['#16a34a', '#60a5fa']);
    const busiest = Math.max(1, ...history.requests.map(p => Math.max(p[0], p[1])));
    drawChart('requests', history.requests, busiest, ['#16a34a', '#f59e0b']);
    drawChart('rate', history.rate, Math.max(1, ...history.rate.map(p => p[0])), ['#222']);
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
