#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "engine/forward_batch_builder.h"
#include "engine/incremental_detokenizer.h"
#include "engine/stop_strings.h"

namespace pagellm::engine {

using scheduler::FinishReason;
using scheduler::Sequence;

struct Engine::Request {
  uint64_t id;
  std::shared_ptr<RequestStream> stream;
  Sampler sampler;
  IncrementalDetokenizer detokenizer;
  StopStringMatcher stops;
  int32_t min_tokens = 0;  // tokens whose text no stop string may end in
  int32_t num_tokens = 0;  // generated so far

  Request(uint64_t id, std::shared_ptr<RequestStream> stream, const GenerationRequest& req,
          uint64_t seed, const Tokenizer& tokenizer, std::span<const int32_t> eos_token_ids)
      : id(id),
        stream(std::move(stream)),
        sampler(req.params, req.prompt, seed, eos_token_ids),
        detokenizer(
            tokenizer, DetokenizeOptions{req.skip_special_tokens, std::nullopt},
            // The end of the prompt as context, so the first word is spaced
            // as it would be inside the whole text.
            std::span<const int32_t>(req.prompt).last(std::min<size_t>(req.prompt.size(), 4))),
        stops(req.params.stop, req.params.include_stop_str_in_output),
        min_tokens(req.params.min_tokens) {}
};

namespace {

// Logprobs are those of the model's own logits, which the host computes; without them
// the token is the argmax (greedy) or the sampling kernel's draw, after the penalties,
// which the backend computes where the logits are.
bool wants_logprobs(const scheduler::SamplingParams& p) {
  return p.logprobs || p.top_logprobs > 0;
}

EngineConfig resolve(EngineConfig config, const ModelConfig& model) {
  if (config.scheduler.max_model_len <= 0) {
    config.scheduler.max_model_len = static_cast<int32_t>(
        std::min<int64_t>(model.context_length(), std::numeric_limits<int32_t>::max()));
  }
  config.scheduler.sliding_window = static_cast<int32_t>(model.sliding_window);
  return config;
}

}  // namespace

double Engine::now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Engine::Engine(std::unique_ptr<LlamaModel> model, std::shared_ptr<const Tokenizer> tokenizer,
               EngineConfig config)
    : Engine(make_cpu_backend(std::move(model)), std::move(tokenizer), std::move(config)) {}

Engine::Engine(std::unique_ptr<Backend> backend, std::shared_ptr<const Tokenizer> tokenizer,
               EngineConfig config)
    : backend_(std::move(backend)),
      tokenizer_(std::move(tokenizer)),
      config_(resolve(std::move(config), backend_->config())),
      kv_plan_(plan_kv_pool(backend_->config(), default_kv_dtype(backend_->config()),
                            config_.num_kv_blocks, std::nullopt, config_.scheduler.max_model_len)),
      kv_(static_cast<int32_t>(kv_plan_.num_blocks), config_.enable_prefix_caching),
      scheduler_(config_.scheduler, kv_),
      seed_rng_(config_.seed ? *config_.seed : std::random_device{}()) {
  backend_->allocate_kv_cache(kv_plan_.num_blocks, kv_plan_.dtype);
  publish_stats(BlockMapRefresh::kNow);
  alive_ = true;
  thread_ = std::thread(&Engine::loop, this);
}

Engine::~Engine() {
  stop();
}

SubmitResult Engine::submit(GenerationRequest request) {
  std::vector<GenerationRequest> one;
  one.push_back(std::move(request));
  SubmitAllResult all = submit_all(std::move(one));
  SubmitResult result;
  result.status = all.status;
  result.message = std::move(all.message);
  result.param = std::move(all.param);
  if (all.ok()) result.stream = std::move(all.streams.front());
  return result;
}

SubmitAllResult Engine::submit_all(std::vector<GenerationRequest> requests) {
  SubmitAllResult result;
  const auto refuse = [&](scheduler::AddStatus status, std::string message,
                          std::string param = "") {
    result.status = status;
    result.message = std::move(message);
    result.param = std::move(param);
    return result;
  };
  const int64_t count = static_cast<int64_t>(requests.size());
  const int32_t max_waiting = config_.scheduler.max_waiting;
  if (count > max_waiting) {
    return refuse(scheduler::AddStatus::kNeverFits,
                  "the request asks for " + std::to_string(count) +
                      " sequences (its prompts times n), more than the " +
                      std::to_string(max_waiting) + " the server queues at once",
                  "n");
  }
  const int64_t vocab = backend_->config().vocab_size;
  const auto outside = [&](const char* what, int32_t id) {
    return refuse(scheduler::AddStatus::kInvalid,
                  std::string(what) + " token id " + std::to_string(id) +
                      " is outside the vocabulary [0, " + std::to_string(vocab) + ")",
                  what);
  };
  for (const GenerationRequest& request : requests) {
    const scheduler::AddResult check =
        scheduler_.validate(static_cast<int32_t>(request.prompt.size()), request.params.max_tokens);
    if (check.status != scheduler::AddStatus::kAdded) return refuse(check.status, check.message);
    for (int32_t id : request.prompt) {
      if (id < 0 || id >= vocab) return outside("prompt", id);
    }
    for (const auto& [id, bias] : request.params.logit_bias) {
      if (id < 0 || id >= vocab) return outside("logit_bias", id);
    }
  }
  if (!alive_) return refuse(scheduler::AddStatus::kInvalid, "the engine is not running");
  {
    std::lock_guard lock(inbox_mutex_);
    if (stopping_) return refuse(scheduler::AddStatus::kQueueFull, "the server is shutting down");
    const int64_t waiting = static_cast<int64_t>(snapshot_waiting_) + admitted_since_snapshot_ +
                            static_cast<int64_t>(new_requests_.size());
    if (waiting + count > max_waiting) {
      return refuse(
          scheduler::AddStatus::kQueueFull,
          "the waiting queue is full (" + std::to_string(max_waiting) + " sequences); retry later");
    }
    for (GenerationRequest& request : requests) {
      const uint64_t id = next_id_++;
      auto stream = std::make_shared<RequestStream>(id);
      result.streams.push_back(stream);
      new_requests_.push_back({id, std::move(stream), std::move(request)});
    }
  }
  inbox_ready_.notify_one();
  return result;
}

void Engine::abort(uint64_t request_id) {
  {
    std::lock_guard lock(inbox_mutex_);
    aborts_.push_back(request_id);
  }
  inbox_ready_.notify_one();
}

void Engine::stop() {
  {
    std::lock_guard lock(inbox_mutex_);
    stopping_ = true;
  }
  inbox_ready_.notify_one();
  if (thread_.joinable()) thread_.join();
}

EngineStats Engine::stats() const {
  std::lock_guard lock(stats_mutex_);
  EngineStats out = stats_;
  out.alive = alive_.load();
  return out;
}

void Engine::loop() {
  while (true) {
    bool stopping = false;
    std::vector<Submitted> incoming;
    std::vector<uint64_t> aborts;
    {
      std::unique_lock lock(inbox_mutex_);
      inbox_ready_.wait(lock, [&] {
        return stopping_ || !new_requests_.empty() || !aborts_.empty() || scheduler_.has_work();
      });
      incoming.swap(new_requests_);
      admitted_since_snapshot_ += static_cast<int32_t>(incoming.size());
      aborts.swap(aborts_);
      stopping = stopping_;
    }
    try {
      admit(incoming);
      for (uint64_t id : aborts)
        cancel(id, "");
      if (stopping) {
        fail_all("");
        publish_stats();
        break;
      }
      step();
    } catch (const DeviceLostError& e) {
      // The device runs nothing more: what is in flight fails, and new requests are
      // refused (health reports the engine down) until a restart.
      alive_ = false;
      fail_all(std::string("internal error: ") + e.what());
    } catch (const std::exception& e) {
      // Nothing else brings the engine down: the requests in flight fail, the rest go on.
      fail_all(std::string("internal error: ") + e.what());
    }
    // Idle now: the picture of the pool must show the final state.
    publish_stats(scheduler_.has_work() ? BlockMapRefresh::kIfDue : BlockMapRefresh::kNow);
  }
}

void Engine::admit(std::vector<Submitted>& incoming) {
  const double t = now();
  for (Submitted& s : incoming) {
    const uint64_t seed = s.request.params.seed ? *s.request.params.seed : seed_rng_();
    auto seq = std::make_unique<Sequence>();
    for (int64_t eos : backend_->config().eos_token_ids) {
      seq->eos_token_ids.push_back(static_cast<int32_t>(eos));
    }
    auto request = std::make_unique<Request>(s.id, std::move(s.stream), s.request, seed,
                                             *tokenizer_, seq->eos_token_ids);
    seq->id = static_cast<paging::SeqId>(s.id);
    seq->prompt_len = static_cast<int32_t>(s.request.prompt.size());
    seq->tokens = std::move(s.request.prompt);
    seq->params = std::move(s.request.params);
    seq->priority = s.request.priority;
    seq->cache_salt = paging::cache_salt_key(s.request.cache_salt);
    const scheduler::AddResult added = scheduler_.add(std::move(seq), t);
    if (added.status != scheduler::AddStatus::kAdded) {
      GenerationChunk chunk;
      chunk.finished = true;
      chunk.finish_reason = FinishReason::kAbort;
      chunk.error = added.message;
      request->stream->push(std::move(chunk));
      ++failed_;
      continue;
    }
    requests_.emplace(s.id, std::move(request));
  }
}

void Engine::cancel(uint64_t id, const std::string& error) {
  auto seq = scheduler_.abort(static_cast<paging::SeqId>(id), now());
  if (!seq) return;  // finished already, or never known
  auto it = requests_.find(id);
  if (it != requests_.end()) finish(*it->second, *seq, error);
}

void Engine::step() {
  const scheduler::ScheduledBatch batch = scheduler_.schedule(now());
  // What was admitted is now running or waiting: submissions count it from here on, not
  // from the stats snapshot after the forward pass.
  publish_waiting(scheduler_.num_waiting());
  if (batch.empty()) return;
  chunks_.clear();
  for (const scheduler::ScheduledSeq& s : batch.seqs) {
    chunks_.push_back(
        {s.seq->id, s.seq->tokens, s.seq->num_computed, s.num_new_tokens, s.wants_logits});
  }
  build_forward_batch(chunks_, kv_, batch.block_copies, batch_);
  // A row whose request wants no logprobs needs only its argmax (greedy) or a draw the
  // backend makes with the request's own random number, after the penalties the backend
  // applies from the request's counts: its logits can stay on the device. Only the
  // others are sampled here.
  for (const scheduler::ScheduledSeq& s : batch.seqs) {
    if (!s.wants_logits) continue;
    if (wants_logprobs(s.seq->params)) {
      append_host_row(batch_);
      continue;
    }
    batch_.host_logits.push_back(0);
    requests_.at(static_cast<uint64_t>(s.seq->id))->sampler.append_backend_row(batch_);
  }
  drop_unused_row_fields(batch_);
  backend_->forward(batch_, output_);

  const int64_t vocab = backend_->config().vocab_size;
  sampled_ids_.clear();
  sampled_.clear();
  size_t row = 0;
  for (const scheduler::ScheduledSeq& s : batch.seqs) {
    if (!s.wants_logits) continue;
    Request& r = *requests_.at(static_cast<uint64_t>(s.seq->id));
    SampledToken token;
    if (batch_.host_logits[row]) {
      token = r.sampler.sample(std::span<const float>(output_.logits.data() + row * vocab, vocab));
    } else {
      token.token = batch_.sampling.empty() ? output_.argmax[row] : output_.sampled[row];
      r.sampler.observe(token.token);
    }
    ++row;
    sampled_ids_.push_back(token.token);
    sampled_.push_back({&r, std::move(token)});
  }
  const double t = now();
  auto finished = scheduler_.update(batch, sampled_ids_, t);

  // Stream the new tokens; a stop string in the text ends its request here. A token
  // that ended its sequence (a stop token id, or end of sequence) is counted and has its
  // logprobs, but its text is left out, as the stop string is.
  for (auto& [r, token] : sampled_) {
    GenerationChunk chunk;
    const auto ended_by_token = std::find_if(finished.begin(), finished.end(), [&](const auto& s) {
      return s->id == static_cast<paging::SeqId>(r->id) && s->finish_reason == FinishReason::kStop;
    });
    const bool checked = ++r->num_tokens > r->min_tokens;
    if (ended_by_token == finished.end() || r->stops.includes_stop())
      chunk.text = r->stops.push(r->detokenizer.add(token.token), checked);
    chunk.tokens.push_back(std::move(token));
    chunk.token_times.push_back(t);
    const bool stopped = r->stops.stopped();
    r->stream->push(std::move(chunk));
    if (stopped) {
      const auto id = static_cast<paging::SeqId>(r->id);
      if (auto seq = scheduler_.finish(id, FinishReason::kStop, t)) {
        finished.push_back(std::move(seq));
      } else {
        // The same token reached max_tokens, but the text ends at the stop string.
        for (auto& done : finished) {
          if (done->id == id) done->finish_reason = FinishReason::kStop;
        }
      }
    }
  }
  for (auto& seq : finished) {
    auto it = requests_.find(static_cast<uint64_t>(seq->id));
    if (it != requests_.end()) finish(*it->second, *seq, "");
  }
}

void Engine::finish(Request& r, const Sequence& seq, const std::string& error) {
  GenerationChunk chunk;
  FinishReason reason = seq.finish_reason;
  if (!r.stops.stopped()) {
    // The bytes held back at the end (an incomplete character) can complete a stop
    // string too: the text is then cut there, and the reason is the stop.
    chunk.text = r.stops.push(r.detokenizer.finish(), r.num_tokens > r.min_tokens);
    if (r.stops.stopped() && reason == FinishReason::kLength) reason = FinishReason::kStop;
    chunk.text += r.stops.flush();
  }
  chunk.finished = true;
  chunk.finish_reason = reason;
  chunk.error = error;
  chunk.usage.prompt_tokens = seq.prompt_len;
  chunk.usage.completion_tokens = seq.num_output_tokens();
  chunk.usage.cached_prompt_tokens = seq.num_cached_prompt_tokens;
  chunk.times = seq.times;
  switch (reason) {
    case FinishReason::kStop:
      ++finished_stop_;
      break;
    case FinishReason::kLength:
      ++finished_length_;
      break;
    default:
      error.empty() ? ++finished_abort_ : ++failed_;
      break;
  }
  // Stats first: a client that sees its end must see the blocks already returned. The
  // block map waits for the end of the step: redrawing it per finished request would put
  // a pass over the pool in the step once for every request that ends in it.
  publish_stats(BlockMapRefresh::kSkip);
  r.stream->push(std::move(chunk));
  requests_.erase(r.id);  // destroys r
}

void Engine::fail_all(const std::string& error) {
  std::vector<uint64_t> ids;
  for (const auto& [id, r] : requests_)
    ids.push_back(id);
  for (uint64_t id : ids)
    cancel(id, error);
}

void Engine::publish_stats(BlockMapRefresh block_map) {
  const double t = now();
  std::string map;
  // A small pool is drawn every time (microseconds); a large one at most every 200 ms of
  // work, plus once whenever the engine goes idle.
  const bool small_pool = kv_.pool().num_blocks() <= 16384;
  const bool now_asked = block_map == BlockMapRefresh::kNow;
  if (block_map != BlockMapRefresh::kSkip &&
      (now_asked || small_pool || t - block_map_time_ > 0.2)) {
    const paging::BlockPool& pool = kv_.pool();
    map.resize(pool.num_blocks());
    for (paging::BlockId b = 0; b < pool.num_blocks(); ++b) {
      const int32_t refs = pool.ref_count(b);
      map[b] = refs > 1 ? 's' : refs == 1 ? 'u' : pool.is_cached(b) ? 'c' : '.';
    }
    if (!now_asked) block_map_time_ = t;
  }
  std::lock_guard lock(stats_mutex_);
  if (!map.empty()) stats_.block_map.swap(map);
  stats_.num_running = scheduler_.num_running();
  stats_.num_waiting = scheduler_.num_waiting();
  stats_.kv = kv_.usage();
  stats_.scheduler = scheduler_.stats();
  stats_.finished_stop = finished_stop_;
  stats_.finished_length = finished_length_;
  stats_.finished_abort = finished_abort_;
  stats_.failed = failed_;
  publish_waiting(stats_.num_waiting);
}

void Engine::publish_waiting(int32_t waiting) {
  std::lock_guard lock(inbox_mutex_);
  snapshot_waiting_ = waiting;
  admitted_since_snapshot_ = 0;
}

}  // namespace pagellm::engine
