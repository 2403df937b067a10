// Out-of-tree consumer: open an item matrix without copying, run 3 rounds with a toy scorer.
#include <crossknn/crossknn.h>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer ITEMS.npy\n");
    return 2;
  }
  try {
    const crossknn::Features f = crossknn::Features::open_npy(argv[1]);
    // toy exact scorer: the first coordinate of each item
    std::vector<double> row(static_cast<size_t>(f.dim()));
    crossknn::FunctionScorer scorer([&](int64_t, const int64_t* items, int64_t m, float* out) {
      for (int64_t t = 0; t < m; ++t) {
        f.rows(items + t, 1, row.data());
        out[t] = static_cast<float>(row[0]);
      }
    });
    crossknn::SearchOptions o;
    o.budget = 30;
    o.k = 5;
    const auto r = crossknn::search_one(f, scorer, crossknn::no_split_plan(o.budget, 3), o, {});
    std::printf("crossknn %s: %lld items, view=%d, calls=%lld, top-1 id %lld\n",
                crossknn::version(), static_cast<long long>(f.n_items()), f.is_view() ? 1 : 0,
                static_cast<long long>(r.calls), static_cast<long long>(r.ids[0]));
    return r.calls == 30 && f.is_view() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
