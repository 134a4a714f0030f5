#pragma once
// Engine: the serving loop. One engine thread owns the scheduler, the KV cache and the
// model; every step it
//   1. drains the inbox: adds new requests, aborts cancelled ones (their blocks are
//      back in the pool before the step is scheduled);
//   2. schedules a batch (scheduler/), runs one forward pass over it, samples;
//   3. appends the tokens, checks stop conditions, detokenizes incrementally and
//      pushes new text to each request's stream.
// submit() and abort() are safe from any thread and only touch the inbox.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/backend.h"
#include "engine/forward_batch_builder.h"
#include "engine/kv_cache_memory.h"
#include "engine/llama_model.h"
#include "engine/request_stream.h"
#include "engine/tokenizer.h"
#include "paging/kv_cache_manager.h"
#include "scheduler/scheduler.h"

namespace pagellm::engine {

struct EngineConfig {
  // max_model_len <= 0 takes the model's context_length(); the sliding window
  // always comes from the model.
  scheduler::SchedulerConfig scheduler = [] {
    scheduler::SchedulerConfig c;
    c.max_model_len = 0;
    return c;
  }();
  int64_t num_kv_blocks = 0;
  bool enable_prefix_caching = true;
  std::optional<uint64_t> seed;  // for requests without one; unset: random
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  scheduler::SamplingParams params;
  int32_t priority = 0;
  std::string cache_salt;  // requests with different salts never share prefix blocks
  bool skip_special_tokens = true;
};

struct SubmitResult {
  std::shared_ptr<RequestStream> stream;  // null when refused
  scheduler::AddStatus status = scheduler::AddStatus::kAdded;
  std::string message;  // why it was refused
  std::string param;    // the request field at fault, when one is
  bool ok() const { return stream != nullptr; }
};
// Requests submitted together: every one queued (streams[i] is requests[i]'s), or none.
struct SubmitAllResult {
  std::vector<std::shared_ptr<RequestStream>> streams;  // empty when refused
  scheduler::AddStatus status = scheduler::AddStatus::kAdded;
  std::string message;
  std::string param;
  bool ok() const { return status == scheduler::AddStatus::kAdded; }
};

// A snapshot of the engine for metrics and /v1/stats.
struct EngineStats {
  bool alive = false;
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  paging::KVCacheUsage kv;
  scheduler::SchedulerStats scheduler;
  int64_t finished_stop = 0, finished_length = 0, finished_abort = 0, failed = 0;
  // One character per block, in block-id order: '.' free, 'c' cached-free, 'u' used by
  // one sequence, 's' shared by several. Refreshed with every snapshot for pools up to
  // 16,384 blocks; larger ones every 200 ms of work and whenever the engine goes idle.
  std::string block_map;
};

class Engine {
 public:
  // Allocates the KV pool on the backend and starts the engine thread.
  Engine(std::unique_ptr<Backend> backend, std::shared_ptr<const Tokenizer> tokenizer,
         EngineConfig config);
  // The same on the CPU backend.
  Engine(std::unique_ptr<LlamaModel> model, std::shared_ptr<const Tokenizer> tokenizer,
         EngineConfig config);
  ~Engine();  // stop()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Refuses at once, with a message for the client, one that can never
  // run (over the context window or the whole pool), or when the queue is full.
  SubmitResult submit(GenerationRequest request);
  // Queues requests together (the choices of one API request): all of them, or none when
  // one of them would be refused or the queue has no room for them all. More of them
  // than the queue holds (max_waiting) can never be queued: kNeverFits.
  SubmitAllResult submit_all(std::vector<GenerationRequest> requests);
  // Cancels a request in any state; its stream ends with finish reason abort.
  void abort(uint64_t request_id);
  // Aborts everything still running and joins the engine thread.
  void stop();

  EngineStats stats() const;
  bool alive() const { return alive_.load(); }
  const ModelConfig& model_config() const { return backend_->config(); }
  const Backend& backend() const { return *backend_; }
  const EngineConfig& config() const { return config_; }
  const KVPoolPlan& kv_plan() const { return kv_plan_; }
  // Seconds on the engine's monotonic clock (the clock of every request time).
  static double now();

 private:
  struct Request;  // engine-thread state of one request
  struct Submitted {
    uint64_t id;
    std::shared_ptr<RequestStream> stream;
    GenerationRequest request;
  };

  void loop();
  void admit(std::vector<Submitted>& incoming);
  void cancel(uint64_t id, const std::string& error);
  void step();
  void finish(Request& r, const scheduler::Sequence& seq, const std::string& error);
  void fail_all(const std::string& error);
  // What a stats snapshot redraws of the block map: when due (small pools every time,
  // large ones every 200 ms), now, or nothing (counts only).
  enum class BlockMapRefresh { kIfDue, kNow, kSkip };
  void publish_stats(BlockMapRefresh block_map = BlockMapRefresh::kIfDue);
  // The waiting count submit checks against max_waiting, once the scheduler holds every
  // request taken from the inbox.
  void publish_waiting(int32_t waiting);

  std::unique_ptr<Backend> backend_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  EngineConfig config_;
  KVPoolPlan kv_plan_;
  paging::KVCacheManager kv_;
  scheduler::Scheduler scheduler_;

  // Inbox, shared with other threads.
  mutable std::mutex inbox_mutex_;
  std::condition_variable inbox_ready_;
  std::vector<Submitted> new_requests_;
  std::vector<uint64_t> aborts_;
  bool stopping_ = false;
  uint64_t next_id_ = 1;
  // Waiting requests as of the last publish_waiting, and those taken from the inbox since
  // (admitted, but not yet counted there): with new_requests_, what submit counts
  // against max_waiting. Both change under inbox_mutex_.
  int32_t snapshot_waiting_ = 0;
  int32_t admitted_since_snapshot_ = 0;

  // Engine thread only.
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests_;
  std::mt19937_64 seed_rng_;
  std::vector<ScheduledChunk> chunks_;
  ForwardBatch batch_;
  ForwardOutput output_;
  std::vector<int32_t> sampled_ids_;
  std::vector<std::pair<Request*, SampledToken>> sampled_;
  int64_t finished_stop_ = 0, finished_length_ = 0, finished_abort_ = 0, failed_ = 0;

  mutable std::mutex stats_mutex_;
  EngineStats stats_;
  double block_map_time_ = 0;
  std::atomic<bool> alive_{false};
  std::thread thread_;
};

}  // namespace pagellm::engine
