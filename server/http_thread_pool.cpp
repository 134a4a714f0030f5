#include "server/http_thread_pool.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <system_error>

namespace pagellm::server {

HttpThreadPool::HttpThreadPool(size_t initial_threads, size_t max_threads)
    : max_threads_(std::max<size_t>(max_threads, 1)) {
  std::lock_guard lock(mutex_);
  threads_.reserve(max_threads_);  // starting a thread then allocates nothing
  for (size_t i = 0; i < std::min(initial_threads, max_threads_); ++i)
    start_thread();
}

HttpThreadPool::~HttpThreadPool() {
  shutdown();
}

void HttpThreadPool::start_thread() {
  try {
    threads_.emplace_back([this] { work(); });
    ++idle_;  // idle from the start, so that the next job does not start another
  } catch (const std::system_error& e) {
    // No more threads to be had (a process or cgroup limit): jobs past the threads there
    // are wait for one, and the pool stops trying.
    spdlog::warn("could not start HTTP thread {} ({}): connections past {} wait for a thread",
                 threads_.size() + 1, e.what(), threads_.size());
    max_threads_ = std::max<size_t>(threads_.size(), 1);
  }
}

void HttpThreadPool::enqueue(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    jobs_.push_back(std::move(job));
    // Each idle thread takes one queued job; a job beyond them gets a thread of its own.
    if (idle_ < jobs_.size() && threads_.size() < max_threads_) start_thread();
  }
  wake_.notify_one();
}

void HttpThreadPool::work() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, and nothing left to run
    --idle_;
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    job = nullptr;  // its captures go before the lock is taken again
    lock.lock();
    ++idle_;
  }
}

void HttpThreadPool::shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    threads.swap(threads_);
  }
  wake_.notify_all();
  for (std::thread& t : threads)
    t.join();
}

size_t HttpThreadPool::threads() const {
  std::lock_guard lock(mutex_);
  return threads_.size();
}

}  // namespace pagellm::server
