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
#include <vector>

namespace pagellm::bench {

// Median GB/s of `reps` copies of `bytes` bytes (buffers touched first, so no page faults).
inline double measure_copy_bandwidth(int64_t bytes = int64_t(256) << 20, int reps = 7) {
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> src(static_cast<char*>(std::aligned_alloc(64, bytes)));
  std::unique_ptr<char, Free> dst(static_cast<char*>(std::aligned_alloc(64, bytes)));
  std::memset(src.get(), 1, bytes);
  std::memset(dst.get(), 2, bytes);
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel
    {
      const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t chunk = (bytes / nt + 63) / 64 * 64;
      const int64_t begin = std::min(bytes, t * chunk), end = std::min(bytes, begin + chunk);
      std::memcpy(dst.get() + begin, src.get() + begin, end - begin);
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rates.push_back(2.0 * bytes / seconds / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace pagellm::bench
