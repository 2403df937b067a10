// GAR (MacAvaney, Tonellotto and Macdonald, CIKM 2022) as crossknn.search.gar.GAR runs it, for
// crossknn::Searcher: the same batches, frontier order and ties, so the same answer.
#include "searcher_gar.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace crossknn {
namespace detail {

namespace {

// The frontier: item -> key in the order items entered (Python's dict); a popped item leaves a
// hole that nlargest skips.
struct Frontier {
  std::vector<int64_t> item;
  std::vector<double> key;
  std::vector<char> live;
  std::unordered_map<int64_t, size_t> pos;
  size_t n = 0;

  bool has(int64_t i) const { return pos.count(i) != 0; }
  void set(int64_t i, double k) {
    auto it = pos.find(i);
    if (it != pos.end()) {
      key[it->second] = k;
      return;
    }
    pos.emplace(i, item.size());
    item.push_back(i);
    key.push_back(k);
    live.push_back(1);
    ++n;
  }
  double get(int64_t i) const { return key[pos.at(i)]; }
  void pop(int64_t i) {
    auto it = pos.find(i);
    if (it == pos.end()) return;
    live[it->second] = 0;
    pos.erase(it);
    --n;
  }
  // heapq.nlargest(size, items, key): by key descending, ties in entry order
  std::vector<int64_t> largest(int64_t size) const {
    std::vector<size_t> idx;
    for (size_t t = 0; t < item.size(); ++t)
      if (live[t]) idx.push_back(t);
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return key[a] > key[b]; });
    std::vector<int64_t> out;
    for (size_t t = 0; t < idx.size() && static_cast<int64_t>(out.size()) < size; ++t)
      out.push_back(item[idx[t]]);
    return out;
  }
};

}  // namespace

Hits gar_search(const Features& de, double vmax, const GarGraph& graph, Scorer& scorer,
                const SearchRequest& q, const uint64_t* allow) {
  const int64_t N = de.n_items(), B = q.budget, K = q.k;
  if (K < 1) throw std::invalid_argument("k must be >= 1; got " + std::to_string(K));
  if (B < 1) throw std::invalid_argument("the budget must be >= 1 CE call; got " + std::to_string(B));
  if (K > B)
    throw std::invalid_argument("k=" + std::to_string(K) + " exceeds the budget B=" +
                                std::to_string(B) + ": at most B items can be ranked");
  if (B > N)
    throw std::invalid_argument("the budget B=" + std::to_string(B) +
                                " exceeds the number of items (" + std::to_string(N) + ")");
  std::vector<int64_t> order;  // scored items, in scoring order
  std::vector<float> scores32;
  std::unordered_map<int64_t, double> scored;
  auto call = [&](const std::vector<int64_t>& items) {
    std::vector<float> out(items.size(), std::numeric_limits<float>::quiet_NaN());
    ScoreRequest r{0, items.data(), static_cast<int64_t>(items.size()), out.data()};
    scorer.score_batch(&r, 1);
    for (size_t t = 0; t < items.size(); ++t) {
      if (!std::isfinite(out[t]))
        throw std::invalid_argument("the scorer returned a NaN/inf score (or none) for item " +
                                    std::to_string(items[t]));
      order.push_back(items[t]);
      scores32.push_back(out[t]);
      scored[items[t]] = static_cast<double>(out[t]);
    }
  };
  Hits h;
  const int64_t n_allowed = allow ? mask_count(allow, N) : N;
  if (allow) h.allowed = n_allowed;
  if (allow && n_allowed <= B) {  // every allowed item, one step
    std::vector<int64_t> items;
    for (int64_t i = 0; i < N; ++i)
      if (mask_allows(allow, i)) items.push_back(i);
    if (!items.empty()) call(items);
    h.stopped = "allowed";
  } else {
    // the initial ranking: the DE's top B within the mask (DenseRetriever.retrieve)
    std::vector<float> u(static_cast<size_t>(de.dim()));
    scale_first_query(q.query_vector, de.dim(), vmax, u.data());
    std::vector<float> keys(static_cast<size_t>(B));
    std::vector<int64_t> initial(static_cast<size_t>(B));
    const uint64_t* masks[1] = {allow};
    de.top_k(u.data(), 1, B, ExcludeLists{nullptr, nullptr, allow ? masks : nullptr}, keys.data(),
             initial.data());
    Frontier frontier;
    double minscore = std::numeric_limits<double>::infinity();
    int64_t iteration = 0;
    size_t pos = 0;
    auto skip_scored = [&] {
      while (pos < initial.size() && scored.count(initial[pos])) ++pos;
    };
    for (;;) {
      skip_scored();
      const int64_t n_scored = static_cast<int64_t>(scored.size());
      if (!(n_scored < B && (pos < initial.size() || frontier.n > 0))) break;
      const int64_t size = std::min(kGarBatch, B - n_scored);
      std::vector<int64_t> batch;
      for (;;) {
        if (iteration % 2 == 0) {
          skip_scored();
          if (pos < initial.size()) {
            for (size_t j = pos; static_cast<int64_t>(batch.size()) < size && j < initial.size();
                 ++j)
              if (!scored.count(initial[j])) batch.push_back(initial[j]);
            break;
          }
        } else if (frontier.n > 0) {
          batch = frontier.largest(size);
          break;
        }
        ++iteration;
      }
      call(batch);
      for (int64_t i : batch) frontier.pop(i);
      const int64_t left = B - static_cast<int64_t>(scored.size());
      if (left > 0) {  // the frontier grows from the batch, best (score, item) first
        std::vector<std::pair<double, int64_t>> by;
        for (int64_t i : batch) by.emplace_back(scored[i], i);
        std::sort(by.begin(), by.end(), std::greater<>());
        for (const auto& si : by) {
          const double s = si.first;
          if (static_cast<int64_t>(frontier.n) < left || s >= minscore) {
            bool hit = false;
            for (int64_t j = 0; j < graph.k; ++j) {
              const int64_t t = graph.at(si.second, j);
              if (scored.count(t) || !mask_allows(allow, t)) continue;
              if (!frontier.has(t) || s > frontier.get(t)) {
                frontier.set(t, s);
                hit = true;
              }
            }
            if (hit && s < minscore) minscore = s;
          }
        }
      }
      ++iteration;
    }
  }
  // the final top-k by exact CE score (float32), ties to the smaller item
  std::vector<size_t> idx(order.size());
  for (size_t t = 0; t < idx.size(); ++t) idx[t] = t;
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    return scores32[a] > scores32[b] || (scores32[a] == scores32[b] && order[a] < order[b]);
  });
  for (size_t t = 0; t < idx.size() && static_cast<int64_t>(t) < K; ++t) {
    h.indices.push_back(order[idx[t]]);
    h.scores.push_back(scores32[idx[t]]);
  }
  h.ce_calls = static_cast<int64_t>(order.size());
  h.scored_items = std::move(order);
  h.scored_scores = std::move(scores32);
  return h;
}

}  // namespace detail
}  // namespace crossknn
