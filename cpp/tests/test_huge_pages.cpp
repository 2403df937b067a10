// The allocator of the large tables (cpp/src/huge_pages.h): blocks of >= 4 MiB start on a 2 MiB
// boundary where Linux offers huge pages on request and CROSSKNN_HUGE_PAGES is not 0; every
// block holds its values; vectors grow and copy through it as through std::allocator.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../src/huge_pages.h"
#include "check.h"

using crossknn::detail::HugePageAllocator;
using crossknn::detail::HugeVector;

int main() {
  const bool off = std::getenv("CROSSKNN_HUGE_PAGES") &&
                   std::strcmp(std::getenv("CROSSKNN_HUGE_PAGES"), "0") == 0;
  CHECK(HugePageAllocator<double>::enabled() == !off);
  // a large block: aligned to 2 MiB on Linux when enabled; its values survive a resize
  HugeVector<double> big(static_cast<size_t>(5) << 17);  // 5 MiB
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<double>(i) * 0.5;
#if defined(__linux__)
  const auto addr = reinterpret_cast<std::uintptr_t>(big.data());
  if (!off) CHECK(addr % (std::uintptr_t(2) << 20) == 0);
#endif
  big.resize(big.size() + 3, -1.0);
  bool same = true;
  for (size_t i = 0; i + 3 < big.size(); ++i) same = same && big[i] == static_cast<double>(i) * 0.5;
  CHECK(same);
  CHECK(big.back() == -1.0);
  // small blocks: plain allocations, the same behaviour
  HugeVector<int8_t> small(100, 7);
  CHECK(small.size() == 100 && small[99] == 7);
  HugeVector<int8_t> copy = small;
  CHECK(copy == small);
  HugeVector<float> empty;
  empty.shrink_to_fit();
  CHECK(empty.empty());
  CHECK(throws<std::bad_alloc>([] { HugePageAllocator<double>().allocate(~std::size_t(0) / 4); }));
  if (failures) std::fprintf(stderr, "%d failures\n", failures);
  return failures != 0;
}
