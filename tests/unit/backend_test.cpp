// Backend selection and the CPU backend's forward contract (argmax of every logit row,
// logits of the rows asked for).

#include "engine/backend.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "engine/demo_model.h"
#include "engine/kv_cache_memory.h"
#include "engine/llama_model.h"
#include "engine/tokenizer_config.h"
#include "support/temp_model.h"

namespace pagellm::engine {
namespace {

namespace fs = std::filesystem;

class BackendTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new testing::TempDemoModel("pagellm_backend_test", demo_model_preset("tiny"));
  }
  static void TearDownTestSuite() { delete model_; }
  static const fs::path& dir() { return model_->path(); }
  static inline testing::TempDemoModel* model_ = nullptr;
};

TEST_F(BackendTest, CpuIsChosenByNameAndByAutoWithoutAGpu) {
  BackendOptions o;
  o.kind = "cpu";
  EXPECT_EQ(load_backend(dir(), o)->name(), "cpu");
  o.kind = "auto";
  const auto backend = load_backend(dir(), o);
  EXPECT_EQ(backend->name(), cuda_device_available() ? "cuda" : "cpu");
  EXPECT_FALSE(backend->device_description().empty());
}

// The threads of this process, as /proc lists them.
int64_t thread_count() {
  int64_t n = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator("/proc/self/task"))
    ++n;
  return n;
}

// Waits up to a second for the thread count to come down to `n`: a thread stays listed
// for a moment after pthread_join has returned (some 1 in 1,000 joins here).
int64_t thread_count_down_to(int64_t n) {
  int64_t now = thread_count();
  for (int i = 0; i < 200 && now > n; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    now = thread_count();
  }
  return now;
}

// Loading a CPU model runs OpenMP regions; a thread that runs one keeps its team of
// workers while it lives, and with the engine thread's team beside it libgomp stops
// letting workers spin between regions. The load leaves the caller without one: the
// workers it started end with the load.
TEST_F(BackendTest, CpuLoadLeavesTheCallerWithoutAnOpenMpTeam) {
  if (omp_get_max_threads() < 2) GTEST_SKIP() << "one OpenMP thread: no workers";
  const int64_t alone = thread_count();
  int64_t before = 0, after = 0;
  std::thread caller([&] {
    before = thread_count();
    BackendOptions o;
    o.kind = "cpu";
    const auto backend = load_backend(dir(), o);
    // The load's own workers exit as its thread ends; give them a moment to be gone.
    after = thread_count_down_to(before);
  });
  caller.join();
  EXPECT_EQ(after, before);
  // The check can fail: a parallel region run here leaves workers behind. It starts once
  // the caller is gone, which would otherwise count before the region and not after.
  ASSERT_EQ(thread_count_down_to(alone), alone);
  std::thread control([&] {
    before = thread_count();
#pragma omp parallel
    { (void)omp_get_thread_num(); }
    after = thread_count();
  });
  control.join();
  EXPECT_GT(after, before);
}

TEST_F(BackendTest, UnknownOrUnavailableBackendsAreRefusedWithAReason) {
  BackendOptions o;
  o.kind = "tpu";
  try {
    load_backend(dir(), o);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown backend 'tpu'"), std::string::npos) << e.what();
  }
  if (!cuda_device_available()) {
    o.kind = "cuda";
    try {
      load_backend(dir(), o);
      FAIL() << "no error";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("backend cuda"), std::string::npos) << e.what();
    }
  }
}

TEST_F(BackendTest, CpuForwardReturnsTheArgmaxOfEveryLogitRow) {
  auto backend = make_cpu_backend(LlamaModel::load(dir()));
  EXPECT_EQ(backend->kv_cache_budget(0.9), std::nullopt);
  backend->allocate_kv_cache(8, default_kv_dtype(backend->config()));
  EXPECT_EQ(backend->kv_cache_bytes(),
            8 * 16 * backend->config().kv_bytes_per_token(default_kv_dtype(backend->config())));
  EXPECT_THROW(backend->allocate_kv_cache(8, default_kv_dtype(backend->config())),
               std::logic_error);
  ForwardBatch b;
  b.token_ids = {5, 6, 7, 9, 11};
  b.positions = {0, 1, 2, 0, 1};
  b.slots = {0, 1, 2, 16, 17};
  b.query_start = {0, 3, 5};
  b.context_lens = {3, 2};
  b.block_tables = {0, 1};
  b.max_blocks_per_seq = 1;
  b.logit_rows = {2, 4};
  b.host_logits = {0, 1};
  ForwardOutput out;
  backend->forward(b, out);
  const int64_t vocab = backend->config().vocab_size;
  ASSERT_EQ(out.argmax.size(), 2u);
  ASSERT_EQ(out.logits.size(), size_t(2 * vocab));
  for (int r = 0; r < 2; ++r) {
    const float* row = out.logits.data() + r * vocab;
    EXPECT_EQ(out.argmax[r], std::max_element(row, row + vocab) - row) << "row " << r;
  }
}

}  // namespace
}  // namespace pagellm::engine
