#pragma once
// The threads that serve HTTP connections. Each connection holds one for as long as it
// is open (a stream, a request waiting for the engine, an idle kept-alive connection),
// so a fixed pool lets long streams and idle clients starve everything else, /health
// included. This pool starts `initial_threads` at once and another whenever a job would
// otherwise wait, up to `max_threads`; past that, jobs wait in order for a thread. A
// thread, once started, stays until shutdown.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pagellm::server {

class HttpThreadPool {
 public:
  HttpThreadPool(size_t initial_threads, size_t max_threads);
  ~HttpThreadPool();  // shutdown()
  HttpThreadPool(const HttpThreadPool&) = delete;
  HttpThreadPool& operator=(const HttpThreadPool&) = delete;

  void enqueue(std::function<void()> job);
  // Runs the jobs already queued, then joins the threads. Jobs enqueued after it are
  // dropped.
  void shutdown();
  size_t threads() const;  // started so far (0 after shutdown)

 private:
  void start_thread();  // with mutex_ held
  void work();

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  size_t max_threads_;  // lowered when the system refuses a thread
  bool stopping_ = false;
};

}  // namespace pagellm::server
