// search_one: AXN rounds for one query over an index folder's item matrix, in C++ only.
//
//   search_one INDEX_DIR SCORES.npy QUERY_ROW [--array items] [--budget 40] [--k 10]
//              [--rounds 4] [--seed 0] [--strategy topk|softmax|random] [--temperature 1]
//              [--split F] [--prior PRIORS.npy --mix LAMBDA] [--allow IDS.npy] [--threads 0]
//
// INDEX_DIR/ARRAY.npy is the item matrix V (N x d; float32, float16, or int8 with
// ARRAY.scales.npy), memory-mapped, never copied. The "cross-encoder" here is a precomputed
// score matrix SCORES.npy (Q x N float32): the scorer reads row QUERY_ROW. A service puts its
// own CE behind the same crossknn::Scorer interface (see docs/cpp.md). Prints the top-k:
// "rank id score" lines, then the calls spent. Same query id (QUERY_ROW) and seed as
// crossknn.search.AXN(V, rounds=R).search(MatrixScorer(S), [QUERY_ROW], seed=S): same ids.
// --allow IDS.npy: int64 ids of the only items the query may be given (a filter, the live
// items): an allow mask (crossknn/features.h); no other item is chosen, scored or printed.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "crossknn/crossknn.h"

namespace {

// The CE stand-in: one row of a precomputed score matrix, memory-mapped.
class ScoreRowScorer final : public crossknn::Scorer {
 public:
  ScoreRowScorer(const std::string& path, int64_t row) : map_(crossknn::map_npy(path)) {
    const auto& h = map_.header;
    if (h.dtype != crossknn::NpyDtype::Float32 || h.shape.size() != 2)
      throw std::invalid_argument(path + ": expected a 2-D float32 score matrix (Q x N)");
    if (row < 0 || row >= h.shape[0])
      throw std::out_of_range("query row " + std::to_string(row) + " is outside [0, " +
                              std::to_string(h.shape[0]) + ")");
    n_ = h.shape[1];
    row_ = static_cast<const float*>(map_.data()) + row * n_;
  }
  int64_t n_items() const { return n_; }
  void score(int64_t /*query*/, const int64_t* items, int64_t m, float* out) override {
    for (int64_t t = 0; t < m; ++t) out[t] = row_[items[t]];
    calls_ += m;
  }
  int64_t calls() const { return calls_; }

 private:
  crossknn::NpyMap map_;
  const float* row_ = nullptr;
  int64_t n_ = 0, calls_ = 0;
};

bool exists(const std::string& p) { return static_cast<bool>(std::ifstream(p)); }

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: search_one INDEX_DIR SCORES.npy QUERY_ROW [--array items] [--budget 40] "
               "[--k 10] [--rounds 4] [--seed 0] [--strategy topk|softmax|random] "
               "[--temperature 1] [--split F] [--prior PRIORS.npy --mix L] [--allow IDS.npy] "
               "[--threads 0]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) usage();
  const std::string index_dir = argv[1], scores_path = argv[2];
  const int64_t query_row = std::atoll(argv[3]);
  std::string array = "items", strategy = "topk", prior_path, allow_path;
  int64_t rounds = 4;
  double split = 0.0;
  int threads = 0;
  crossknn::SearchOptions o;
  o.budget = 40;
  o.k = 10;
  for (int i = 4; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage();
    const char* v = argv[++i];
    if (a == "--array")
      array = v;
    else if (a == "--budget")
      o.budget = std::atoll(v);
    else if (a == "--k")
      o.k = std::atoll(v);
    else if (a == "--rounds")
      rounds = std::atoll(v);
    else if (a == "--seed")
      o.seed = std::strtoull(v, nullptr, 10);
    else if (a == "--strategy")
      strategy = v;
    else if (a == "--temperature")
      o.temperature = std::atof(v);
    else if (a == "--split")
      split = std::atof(v);
    else if (a == "--prior")
      prior_path = v;
    else if (a == "--mix")
      o.mix = std::atof(v);
    else if (a == "--threads")
      threads = std::atoi(v);
    else if (a == "--allow")
      allow_path = v;
    else
      usage();
  }
  try {
    if (strategy == "topk")
      o.strategy = crossknn::Strategy::TopK;
    else if (strategy == "softmax")
      o.strategy = crossknn::Strategy::SoftMax;
    else if (strategy == "random")
      o.strategy = crossknn::Strategy::Random;
    else
      throw std::invalid_argument("strategy must be topk, softmax or random; got " + strategy);

    const std::string base = index_dir + "/" + array;
    const std::string scales = exists(base + ".scales.npy") ? base + ".scales.npy" : "";
    const crossknn::Features V = crossknn::Features::open_npy(base + ".npy", threads, scales);
    ScoreRowScorer ce(scores_path, query_row);
    if (ce.n_items() != V.n_items())
      throw std::invalid_argument("the score matrix has " + std::to_string(ce.n_items()) +
                                  " items; the index has " + std::to_string(V.n_items()));
    std::vector<float> prior_f;
    std::vector<double> prior;
    crossknn::SearchQuery q;
    q.id = static_cast<uint64_t>(query_row);  // the Python loop's query id for row queries
    if (!prior_path.empty()) {
      std::vector<int64_t> shape;
      prior_f = crossknn::load_npy_float32(prior_path, &shape);
      if (shape.size() != 2 || shape[1] != V.dim() || query_row >= shape[0])
        throw std::invalid_argument(prior_path + ": expected (Q, d) query vectors");
      prior.assign(prior_f.begin() + query_row * V.dim(),
                   prior_f.begin() + (query_row + 1) * V.dim());
      q.prior = prior.data();
    }
    std::vector<uint64_t> allow;
    if (!allow_path.empty()) {
      const crossknn::NpyMap ids = crossknn::map_npy(allow_path);
      if (ids.header.dtype != crossknn::NpyDtype::Int64 || ids.header.shape.size() != 1)
        throw std::invalid_argument(allow_path + ": expected a 1-D int64 array of item ids");
      allow.assign(static_cast<size_t>(crossknn::mask_words(V.n_items())), 0);
      const auto* p = static_cast<const int64_t*>(ids.data());
      for (int64_t t = 0; t < ids.header.shape[0]; ++t) {
        if (p[t] < 0 || p[t] >= V.n_items())
          throw std::out_of_range(allow_path + ": item id " + std::to_string(p[t]) +
                                  " is outside [0, " + std::to_string(V.n_items()) + ")");
        allow[static_cast<size_t>(p[t] >> 6)] |= uint64_t{1} << (p[t] & 63);
      }
      q.allow = allow.data();
    }
    const auto plan = split > 0.0 ? crossknn::split_plan(o.budget, rounds, split)
                                  : crossknn::no_split_plan(o.budget, rounds);
    const crossknn::SearchResult r = crossknn::search_one(V, ce, plan, o, q);
    std::printf("# %s: %lld x %lld %s (memory-mapped), query %lld, budget %lld, %s\n", base.c_str(),
                static_cast<long long>(V.n_items()), static_cast<long long>(V.dim()),
                crossknn::storage_name(V.storage()), static_cast<long long>(query_row),
                static_cast<long long>(o.budget), strategy.c_str());
    for (size_t t = 0; t < r.ids.size(); ++t)
      std::printf("%zu %lld %.6g\n", t + 1, static_cast<long long>(r.ids[t]), r.scores[t]);
    std::printf("# calls %lld (scorer saw %lld)\n", static_cast<long long>(r.calls),
                static_cast<long long>(ce.calls()));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "search_one: %s\n", e.what());
    return 1;
  }
}
