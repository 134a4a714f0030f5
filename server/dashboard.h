#pragma once
// GET /dashboard: one self-contained HTML page that polls /v1/stats and draws the KV
// block pool (used, cached-free, free), the queues and the token rates.

namespace pagellm::server {

const char* dashboard_html();

}  // namespace pagellm::server
