#pragma once
// GAR for crossknn::Searcher (private): crossknn.search.gar.GAR step for step.
#include <cstdint>
#include <vector>

#include "crossknn/features.h"
#include "crossknn/search.h"
#include "crossknn/searcher.h"

namespace crossknn {
namespace detail {

constexpr int64_t kGarBatch = 16;  // crossknn.search.gar.DEFAULT_BATCH

struct GarGraph {
  const int64_t* g64 = nullptr;  // N x k item indices, int64 or int32
  const int32_t* g32 = nullptr;
  int64_t k = 0;
  int64_t at(int64_t item, int64_t j) const { return g64 ? g64[item * k + j] : g32[item * k + j]; }
};

// One query: the DE's top `budget` items (de, vmax: the first stage) as the initial ranking,
// batches of kGarBatch through `scorer`, the final top-k by CE score (ties to the lower item).
Hits gar_search(const Features& de, double vmax, const GarGraph& graph, Scorer& scorer,
                const SearchRequest& q, const uint64_t* allow);

}  // namespace detail
}  // namespace crossknn
