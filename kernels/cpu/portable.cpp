#include <atomic>

#include "kernels/cpu/simd.h"

namespace pagellm::kernels::cpu {
namespace {
std::atomic<bool> g_portable{false};
}  // namespace

void set_portable_kernels(bool on) {
  g_portable.store(on, std::memory_order_relaxed);
}
bool portable_kernels() {
  return g_portable.load(std::memory_order_relaxed);
}

}  // namespace pagellm::kernels::cpu
