#pragma once
// The threads that serve HTTP connections. Each connection holds one for as long as it
// is open (a stream, a request waiting for the engine, an idle kept-alive connection),
// so a fixed pool lets long streams and idle clients starve everything else, /health
// included. This pool starts `initial_threads` at once and another whenever a job would
// otherwise wait, up to `max_threads`; past that, jobs wait in order for a thread. A
// thread beyond the initial ones that has had nothing to do for `idle_timeout` ends, so
// that a burst of connections does not keep its threads for good.

#include <chrono>
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
  HttpThreadPool(size_t initial_threads, size_t max_threads,
                 std::chrono::milliseconds idle_timeout = std::chrono::seconds(60));
  ~HttpThreadPool();  // shutdown()
  HttpThreadPool(const HttpThreadPool&) = delete;
  HttpThreadPool& operator=(const HttpThreadPool&) = delete;

  void enqueue(std::function<void()> job);
  // Runs the jobs already queued, then joins the threads. Jobs enqueued after it are
  // dropped.
  void shutdown();
  size_t threads() const;  // running now (0 after shutdown)

 private:
  void start_thread();  // with mutex_ held
  void work(size_t slot);

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  // One slot a thread; the slots of threads that ended are in free_slots_ (their thread
  // is joined when the slot is used again, or at shutdown). Both hold max_threads from
  // the start, so that starting a thread allocates nothing.
  std::vector<std::thread> slots_;
  std::vector<size_t> free_slots_;
  size_t running_ = 0;
  size_t idle_ = 0;
  size_t initial_threads_;
  size_t max_threads_;  // lowered when the system refuses a thread
  std::chrono::milliseconds idle_timeout_;
  bool stopping_ = false;
};

}  // namespace pagellm::server
