#pragma once
// The machine's memory bandwidth, measured the way the decode roofline needs it: a large
// copy split over all threads, counting bytes read plus bytes written.

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

namespace pagellm::bench {

// Two buffers of `bytes` bytes, touched once (no page faults in the timings), for
// measuring again and again: on a shared machine the bandwidth drifts within seconds, so
// a roofline is best taken next to the figure it bounds.
class CopyBandwidth {
 public:
  explicit CopyBandwidth(int64_t bytes = int64_t(256) << 20)
      : bytes_(bytes),
        src_(static_cast<char*>(std::aligned_alloc(64, bytes))),
        dst_(static_cast<char*>(std::aligned_alloc(64, bytes))) {
    if (!src_ || !dst_) throw std::bad_alloc();
    std::memset(src_.get(), 1, bytes);
    std::memset(dst_.get(), 2, bytes);
  }

  // Median GB/s (read + write) of `reps` copies.
  double measure(int reps = 7) {
    std::vector<double> rates;
    for (int r = 0; r < reps; ++r) {
      const auto start = std::chrono::steady_clock::now();
#pragma omp parallel
      {
        const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t chunk = (bytes_ / nt + 63) / 64 * 64;
        const int64_t begin = std::min(bytes_, t * chunk), end = std::min(bytes_, begin + chunk);
        std::memcpy(dst_.get() + begin, src_.get() + begin, end - begin);
      }
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      rates.push_back(2.0 * bytes_ / seconds / 1e9);
    }
    std::sort(rates.begin(), rates.end());
    return rates[rates.size() / 2];
  }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  int64_t bytes_;
  std::unique_ptr<char, Free> src_, dst_;
};

}  // namespace pagellm::bench
