#include "server/http_thread_pool.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <system_error>

namespace pagellm::server {

HttpThreadPool::HttpThreadPool(size_t initial_threads, size_t max_threads,
                               std::chrono::milliseconds idle_timeout)
    : max_threads_(std::max<size_t>(max_threads, 1)), idle_timeout_(idle_timeout) {
  initial_threads_ = std::min(initial_threads, max_threads_);
  std::lock_guard lock(mutex_);
  slots_.reserve(max_threads_);  // starting a thread then allocates nothing
  free_slots_.reserve(max_threads_);
  for (size_t i = 0; i < initial_threads_; ++i)
    start_thread();
}

HttpThreadPool::~HttpThreadPool() {
  shutdown();
}

void HttpThreadPool::start_thread() {
  const bool reuse = !free_slots_.empty();
  const size_t slot = reuse ? free_slots_.back() : slots_.size();
  // A thread that ended holds no lock any more: it is gone, or about to be.
  if (reuse && slots_[slot].joinable()) slots_[slot].join();
  try {
    std::thread thread([this, slot] { work(slot); });
    if (reuse) {
      free_slots_.pop_back();
      slots_[slot] = std::move(thread);
    } else {
      slots_.push_back(std::move(thread));
    }
    ++running_;
    ++idle_;  // idle from the start, so that the next job does not start another
  } catch (const std::system_error& e) {
    // No more threads to be had (a process or cgroup limit): jobs past the threads there
    // are wait for one, and the pool stops trying.
    spdlog::warn("could not start HTTP thread {} ({}): connections past {} wait for a thread",
                 running_ + 1, e.what(), running_);
    max_threads_ = std::max<size_t>(running_, 1);
  }
}

void HttpThreadPool::enqueue(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    jobs_.push_back(std::move(job));
    // Each idle thread takes one queued job; a job beyond them gets a thread of its own.
    if (idle_ < jobs_.size() && running_ < max_threads_) start_thread();
  }
  wake_.notify_one();
}

void HttpThreadPool::work(size_t slot) {
  std::unique_lock lock(mutex_);
  for (;;) {
    const auto ready = [&] { return stopping_ || !jobs_.empty(); };
    if (!wake_.wait_for(lock, idle_timeout_, ready)) {
      if (running_ <= initial_threads_) continue;
      // Idle for the timeout, beyond the initial threads: this one ends.
      --running_;
      --idle_;
      free_slots_.push_back(slot);
      return;
    }
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
    threads.swap(slots_);
    free_slots_.clear();
    running_ = 0;
  }
  wake_.notify_all();
  for (std::thread& t : threads) {
    if (t.joinable()) t.join();
  }
}

size_t HttpThreadPool::threads() const {
  std::lock_guard lock(mutex_);
  return running_;
}

}  // namespace pagellm::server
