#include <algorithm>
#include <cstdlib>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "kernels/cpu/kernels.h"

namespace pagellm::kernels::cpu {

void* allocate_streamed(int64_t bytes) {
  // From 1 MiB on, rounding up to a 2 MiB page costs less than half the size.
  constexpr int64_t kHuge = int64_t(2) << 20;
  const int64_t align = bytes >= kHuge / 2 ? kHuge : 64;
  const int64_t size = std::max<int64_t>(64, (bytes + align - 1) / align * align);
  void* p = std::aligned_alloc(static_cast<size_t>(align), static_cast<size_t>(size));
  if (p == nullptr) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (align == kHuge) madvise(p, static_cast<size_t>(size), MADV_HUGEPAGE);
#endif
  return p;
}

}  // namespace pagellm::kernels::cpu
