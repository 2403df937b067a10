#pragma once
// The items each query of a search has scored (the round loop's budget accounting, search.cpp).

#include <cstdint>
#include <unordered_set>
#include <vector>

namespace crossknn::detail {

// One bit per item and query while all the bits stay within `limit_bytes` (Q x N / 8 bytes;
// default 64 MiB), else a hash set per query. insert() is O(1) either way.
class ScoredSets {
 public:
  ScoredSets(int64_t n_queries, int64_t n_items, double limit_bytes = 64.0 * (1 << 20))
      : words_((n_items + 63) / 64) {
    if (static_cast<double>(n_queries) * static_cast<double>(words_) * 8.0 <= limit_bytes)
      bits_.assign(static_cast<size_t>(n_queries * words_), 0);
    else
      sets_.resize(static_cast<size_t>(n_queries));
  }
  bool uses_bits() const noexcept { return sets_.empty(); }
  // marks `item` (in [0, n_items)) scored for query q; false if it already was
  bool insert(int64_t q, int64_t item) {
    if (sets_.empty()) {
      uint64_t& w = bits_[static_cast<size_t>(q * words_ + (item >> 6))];
      const uint64_t bit = uint64_t{1} << (item & 63);
      if (w & bit) return false;
      w |= bit;
      return true;
    }
    return sets_[static_cast<size_t>(q)].insert(item).second;
  }

 private:
  int64_t words_;
  std::vector<uint64_t> bits_;
  std::vector<std::unordered_set<int64_t>> sets_;
};

}  // namespace crossknn::detail
