#pragma once
// Internal: an allocator for the large tables the rounds read at random (the item Gram caches,
// gram.h). Where Linux offers transparent huge pages on request (the common "madvise" mode),
// blocks of 4 MiB and more are placed on 2 MiB boundaries and marked MADV_HUGEPAGE before they
// are first touched: with 4 KiB pages nearly every entry read at random (a query's scored items
// in a 3,633 x 3,633 table) is a TLB miss on top of its cache miss. Elsewhere, or when the
// kernel declines, it is a plain allocation (CROSSKNN_HUGE_PAGES=0: always).
#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace crossknn::detail {

template <class T>
struct HugePageAllocator {
  using value_type = T;
  static constexpr std::size_t kHuge = std::size_t(2) << 20;

  HugePageAllocator() noexcept = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_alloc();
    const std::size_t bytes = n * sizeof(T);
    void* p = nullptr;
#if defined(__linux__)
    if (bytes >= 2 * kHuge && enabled()) {
      const std::size_t size = (bytes + kHuge - 1) / kHuge * kHuge;
      p = std::aligned_alloc(kHuge, size);
      if (p) madvise(p, size, MADV_HUGEPAGE);  // a hint: its failure leaves 4 KiB pages
    }
#endif
    if (!p) p = std::malloc(bytes > 0 ? bytes : 1);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept { std::free(p); }

  // CROSSKNN_HUGE_PAGES=0 turns the request off (plain allocations), read once
  static bool enabled() noexcept {
    static const bool on = [] {
      const char* e = std::getenv("CROSSKNN_HUGE_PAGES");
      return !(e && e[0] == '0' && e[1] == '\0');
    }();
    return on;
  }

  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const HugePageAllocator<U>&) const noexcept {
    return false;
  }
};

template <class T>
using HugeVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace crossknn::detail
