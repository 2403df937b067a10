// search_index: a C++ service's default search over an index folder that Python's
// `crossknn build` (add / remove / refine) wrote, in C++ only.
//
//   search_index INDEX_DIR --query-vector Q.npy --scores S.npy [--method M] [-k K]
//                [--budget B] [--allow IDS.npy] [--seed S] [--query-id ID] [--rounds R]
//                [--target-recall T] [--round-index auto|exact] [--threads T]
//
// Q.npy: the query's DE vector (float32, d). S.npy: a float32 row of N CE scores, the stand-in
// CE: the scorer returns S[item] (a service puts its own CE behind crossknn::Scorer instead; see
// docs/cpp.md). --allow IDS.npy: int64 item positions, the only items the query may be given
// (removed items never are). --query-id: the id Python seeds the query's random draws with
// (crossknn.search.engine.query_id_int(text); only adacur-random reads it). --target-recall: the
// early stop the index calibrated (Python's Searcher(target_recall=T); auto only). Prints one line per
// hit, "rank id score" (the index's item ids, scores with 9 significant digits: every float32
// exactly), then "ce_calls N". Exit status 2 on a usage error, 1 on any other error (one line
// on stderr).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "crossknn/crossknn.h"
#include "crossknn/index.h"
#include "crossknn/searcher.h"

namespace {

// The CE stand-in: a row of N precomputed CE scores, memory-mapped.
class RowScorer final : public crossknn::Scorer {
 public:
  RowScorer(const std::string& path, int64_t n) : map_(crossknn::map_npy(path)) {
    const auto& h = map_.header;
    if (h.dtype != crossknn::NpyDtype::Float32 || h.count() != n)
      throw std::invalid_argument(path + ": expected " + std::to_string(n) +
                                  " float32 CE scores (one per item); got " +
                                  crossknn::npy_dtype_name(h.dtype) + " with " +
                                  std::to_string(h.count()) + " values");
    row_ = static_cast<const float*>(map_.data());
  }
  void score(int64_t /*query*/, const int64_t* items, int64_t m, float* out) override {
    for (int64_t t = 0; t < m; ++t) out[t] = row_[items[t]];
  }

 private:
  crossknn::NpyMap map_;
  const float* row_ = nullptr;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "search_index: %s\nusage: search_index INDEX_DIR --query-vector Q.npy --scores "
               "S.npy [--method M] [-k K] [--budget B] [--allow IDS.npy] [--seed S] "
               "[--query-id ID] [--rounds R] [--target-recall T] [--round-index auto|exact] "
               "[--threads T]\n",
               why);
  std::exit(2);
}

int64_t to_int(const char* s, const char* what) {
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (!*s || *end) usage((std::string(what) + " must be an integer; got " + s).c_str());
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) usage("INDEX_DIR is missing");
  const std::string dir = argv[1];
  std::string qpath, spath, allow_path;
  crossknn::SearchRequest req;
  crossknn::SearcherOptions opt;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage((a + " needs a value").c_str());
    const char* v = argv[++i];
    if (a == "--query-vector")
      qpath = v;
    else if (a == "--scores")
      spath = v;
    else if (a == "--method")
      req.method = v;
    else if (a == "-k" || a == "--k")
      req.k = to_int(v, "-k");
    else if (a == "--budget")
      req.budget = to_int(v, "--budget");
    else if (a == "--allow")
      allow_path = v;
    else if (a == "--seed")
      req.seed = static_cast<uint64_t>(std::strtoull(v, nullptr, 10));
    else if (a == "--query-id")
      req.query_id = static_cast<uint64_t>(std::strtoull(v, nullptr, 10));
    else if (a == "--target-recall")
      req.target_recall = std::strtod(v, nullptr);
    else if (a == "--rounds")
      req.rounds = to_int(v, "--rounds");
    else if (a == "--round-index")
      opt.round_index = v;
    else if (a == "--threads")
      opt.threads = static_cast<int>(to_int(v, "--threads"));
    else
      usage(("unknown option " + a).c_str());
  }
  if (qpath.empty() || spath.empty()) usage("--query-vector and --scores are required");
  try {
    auto index = crossknn::Index::open(dir);
    const crossknn::Searcher searcher(index, opt);
    const crossknn::NpyMap q = crossknn::map_npy(qpath);
    if (q.header.dtype != crossknn::NpyDtype::Float32 || q.header.count() != index->dim())
      throw std::invalid_argument(qpath + ": expected the DE query vector, " +
                                  std::to_string(index->dim()) + " float32 values");
    req.query_vector = static_cast<const float*>(q.data());
    RowScorer scorer(spath, index->n_items());
    std::vector<uint64_t> allow;
    if (!allow_path.empty()) {
      const crossknn::NpyMap ids = crossknn::map_npy(allow_path);
      if (ids.header.dtype != crossknn::NpyDtype::Int64 || ids.header.shape.size() != 1)
        throw std::invalid_argument(allow_path + ": expected a 1-D int64 array of item positions");
      allow.assign(static_cast<size_t>(crossknn::mask_words(index->n_items())), 0);
      const int64_t* p = static_cast<const int64_t*>(ids.data());
      for (int64_t t = 0; t < ids.header.count(); ++t) {
        if (p[t] < 0 || p[t] >= index->n_items())
          throw std::out_of_range(allow_path + ": item " + std::to_string(p[t]) +
                                  " is outside [0, " + std::to_string(index->n_items()) + ")");
        allow[p[t] >> 6] |= uint64_t{1} << (p[t] & 63);
      }
      req.allow = allow.data();
    }
    const crossknn::Hits hits = searcher.search(scorer, req);
    for (size_t r = 0; r < hits.indices.size(); ++r)
      std::printf("%zu %s %.9g\n", r + 1, index->ids()[hits.indices[r]].c_str(),
                  static_cast<double>(hits.scores[r]));
    std::printf("ce_calls %lld\n", static_cast<long long>(hits.ce_calls));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "search_index: %s\n", e.what());
    return 1;
  }
  return 0;
}
