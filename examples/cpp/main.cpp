// rounds: crossknn's round engine from C++, with your scorer behind crossknn::Scorer.
//
//   cmake -S examples/cpp -B build/example -DCROSSKNN_SOURCE_DIR=$PWD && cmake --build build/example
//   build/example/rounds [N] [BUDGET]
//
// N items with 32-dimensional features (random here; in a service, the DE item vectors of an
// index: crossknn::Features::open_npy("INDEX/de_items.npy") maps them without a copy). The
// "cross-encoder" is a function of the query and an item that the features only approximate
// (a service calls its CE there, one batch per round step). AXN-style rounds: a random first
// round, then least squares on the items scored so far picks each next round's items. Prints
// the top-10 and the share of the exact top-10 (every item scored) found with BUDGET calls.
#include <crossknn/crossknn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <set>
#include <vector>

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 20000;
  const int64_t budget = argc > 2 ? std::atoll(argv[2]) : 100;
  const int64_t d = 32, k = 10;
  try {
    std::mt19937_64 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> items(static_cast<size_t>(n * d));
    for (auto& x : items) x = normal(rng);
    std::vector<float> query(static_cast<size_t>(d));
    for (auto& x : query) x = normal(rng);

    // the exact scorer: near-linear in the features, with a term they cannot express
    auto exact = [&](int64_t item) {
      const float* v = &items[static_cast<size_t>(item * d)];
      const float dot = std::inner_product(v, v + d, query.begin(), 0.0f);
      return dot + 0.3f * std::sin(3.0f * v[0] * v[1]);
    };
    int64_t calls = 0;
    crossknn::FunctionScorer scorer([&](int64_t, const int64_t* ids, int64_t m, float* out) {
      for (int64_t t = 0; t < m; ++t) out[t] = exact(ids[t]);
      calls += m;
    });

    // the caller's memory, viewed (no copy); int8 storage would read 4x fewer bytes per round
    const auto features = crossknn::Features::view_float32(items.data(), n, d);
    crossknn::SearchOptions options;
    options.budget = budget;
    options.k = k;
    const auto plan = crossknn::no_split_plan(budget, 5);
    const auto result = crossknn::search_one(features, scorer, plan, options);

    // the exact top-k, to measure what the budget found
    std::vector<int64_t> all(static_cast<size_t>(n));
    std::iota(all.begin(), all.end(), 0);
    std::partial_sort(all.begin(), all.begin() + k, all.end(),
                      [&](int64_t a, int64_t b) { return exact(a) > exact(b); });
    const std::set<int64_t> truth(all.begin(), all.begin() + k);
    int64_t found = 0;
    for (int64_t i = 0; i < k; ++i) {
      std::printf("%2lld. item %6lld  score %7.3f\n", static_cast<long long>(i + 1),
                  static_cast<long long>(result.ids[i]), result.scores[i]);
      found += truth.count(result.ids[i]);
    }
    std::printf("crossknn %s: %lld scorer calls of %lld items; Top-%lld-Recall %.2f\n",
                crossknn::version(), static_cast<long long>(result.calls),
                static_cast<long long>(n), static_cast<long long>(k),
                static_cast<double>(found) / static_cast<double>(k));
    return result.calls == calls && calls <= budget ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
