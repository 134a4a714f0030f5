// The pool of HTTP connection threads: grows while every thread is held, up to its cap,
// and shrinks back when the extra threads are idle.

#include "server/http_thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace pagellm::server {
namespace {

using namespace std::chrono_literals;

// Jobs that hold their thread until released, as open connections do.
struct HeldJobs {
  std::mutex mutex;
  std::condition_variable changed;
  int started = 0, finished = 0;
  bool released = false;

  std::function<void()> job() {
    return [this] {
      std::unique_lock lock(mutex);
      ++started;
      changed.notify_all();
      changed.wait(lock, [&] { return released; });
      ++finished;
      changed.notify_all();
    };
  }
  bool wait_started(int n) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, 10s, [&] { return started >= n; });
  }
  void release() {
    std::lock_guard lock(mutex);
    released = true;
    changed.notify_all();
  }
  bool wait_finished(int n) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, 10s, [&] { return finished >= n; });
  }
};

TEST(HttpThreadPool, AJobThatWouldWaitGetsANewThread) {
  HttpThreadPool pool(1, 64);
  HeldJobs held;
  for (int i = 0; i < 8; ++i)
    pool.enqueue(held.job());
  EXPECT_TRUE(held.wait_started(8));  // all at once, on one thread to begin with
  EXPECT_EQ(pool.threads(), 8u);
  held.release();
  EXPECT_TRUE(held.wait_finished(8));
}

TEST(HttpThreadPool, PastTheCapJobsWaitInOrder) {
  HttpThreadPool pool(1, 2);
  HeldJobs held;
  for (int i = 0; i < 4; ++i)
    pool.enqueue(held.job());
  ASSERT_TRUE(held.wait_started(2));
  std::this_thread::sleep_for(100ms);
  {
    std::lock_guard lock(held.mutex);
    EXPECT_EQ(held.started, 2);
  }
  EXPECT_EQ(pool.threads(), 2u);
  held.release();
  EXPECT_TRUE(held.wait_finished(4));
}

TEST(HttpThreadPool, IdleThreadsTakeTheNextJobs) {
  HttpThreadPool pool(2, 64);
  std::atomic<int> ran{0};
  for (int i = 0; i < 50; ++i) {
    HeldJobs one;
    pool.enqueue(one.job());
    one.release();
    ASSERT_TRUE(one.wait_finished(1));
    ++ran;
  }
  EXPECT_EQ(ran.load(), 50);
  // One job at a time reuses the threads there are (a thread on its way back to idle
  // when the next job comes can make the pool start one more, on a busy machine).
  EXPECT_LE(pool.threads(), 6u);
}

// Waits up to 10 s for the pool to run `n` threads.
bool wait_threads(const HttpThreadPool& pool, size_t n) {
  for (auto deadline = std::chrono::steady_clock::now() + 10s;
       std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(5ms)) {
    if (pool.threads() == n) return true;
  }
  return false;
}

TEST(HttpThreadPool, ThreadsBeyondTheInitialOnesEndWhenIdleAndComeBackWhenNeeded) {
  HttpThreadPool pool(2, 16, 50ms);
  for (int round = 0; round < 3; ++round) {
    HeldJobs held;
    for (int i = 0; i < 10; ++i)
      pool.enqueue(held.job());
    ASSERT_TRUE(held.wait_started(10)) << round;
    EXPECT_EQ(pool.threads(), 10u);
    held.release();
    ASSERT_TRUE(held.wait_finished(10));
    // Idle past the timeout: back to the initial two, which stay.
    EXPECT_TRUE(wait_threads(pool, 2)) << pool.threads();
    std::this_thread::sleep_for(150ms);
    EXPECT_EQ(pool.threads(), 2u);
  }
  // The two left take jobs as before.
  HeldJobs one;
  pool.enqueue(one.job());
  one.release();
  EXPECT_TRUE(one.wait_finished(1));
}

TEST(HttpThreadPool, ShutdownRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  {
    HttpThreadPool pool(1, 1);
    for (int i = 0; i < 20; ++i)
      pool.enqueue([&] { ++ran; });
    pool.shutdown();
    EXPECT_EQ(ran.load(), 20);
    pool.enqueue([&] { ++ran; });  // after shutdown: dropped
  }
  EXPECT_EQ(ran.load(), 20);
}

}  // namespace
}  // namespace pagellm::server
