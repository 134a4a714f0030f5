#pragma once
// A client for server-sent events: POSTs a JSON body and gathers every data payload.

#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace pagellm::test {

struct Sse {
  int status = 0;
  std::vector<nlohmann::json> events;  // every data payload but [DONE]
  bool done = false;                   // saw data: [DONE]
};

// POSTs `body` and reads the SSE stream. `stop_after` > 0 hangs up after that many events.
inline Sse post_stream(httplib::Client& client, const std::string& path, const nlohmann::json& body,
                       size_t stop_after = 0) {
  Sse out;
  std::string buffer;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.response_handler = [&](const httplib::Response& res) {
    out.status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buffer.append(data, n);
    size_t end;
    while ((end = buffer.find("\n\n")) != std::string::npos) {
      const std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;  // comments
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        out.done = true;
      } else {
        out.events.push_back(nlohmann::json::parse(payload));
      }
    }
    return stop_after == 0 || out.events.size() < stop_after;
  };
  client.send(req);
  return out;
}

}  // namespace pagellm::test
