#pragma once
// crossknn/searcher.h: the default search of a C++ service over an index folder
// (crossknn/index.h): Python's crossknn.Searcher.search, with the service's CE.
//
//   auto index = crossknn::Index::open("INDEX_DIR");
//   crossknn::Searcher searcher(index);
//   crossknn::SearchRequest req;
//   req.query_vector = de_vector.data();   // the query's DE vector (index->dim() floats)
//   crossknn::Hits hits = searcher.search(my_ce, req);  // method auto, k 10, B 100
//
// The CE is a crossknn::Scorer (crossknn/search.h): the loop calls score_batch once per round
// with the round's new items (query 0). Methods: those of Python's registry that need no
// Python model (Index::methods(): auto, axn, rnr, gar with the index's corpus graph and, with
// the CUR rows, adacur, adacur-split, adacur-softmax, adacur-random, anncur); defaults (method,
// rounds, first step, penalties, score map) are the ones the index records, as in Python. For
// an index built by Python, the same DE vector, CE scores, seed and query id give the same ids,
// scores and CE calls as crossknn.Searcher.search, bit for bit: both run the same C++ code (the
// loop, crossknn/auto_index.h).
//
// Query ids. Python's Searcher seeds a query's random draws with its text
// (crossknn.search.engine.query_id_int(text): 8 bytes of BLAKE2b); pass that as query_id. Only
// methods with random steps (adacur-random, adacur-softmax) read it; auto, axn, rnr, gar,
// adacur, adacur-split and anncur with the DE first step draw nothing.
//
// FAISS round indexes. An index built with a FAISS round index (params.round_index kind "ivf"
// or "hnsw") serves AXN's rounds through it in Python. This C++ build has no FAISS: such a
// search is refused with one line unless SearcherOptions::round_index is "exact" (exact rounds,
// Python's Searcher(round_index="exact")). `auto`, rnr and the CUR methods never use it.
//
// Threads. A Searcher is immutable after construction; search() may run concurrently from many
// threads (each call with its own Scorer).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "crossknn/auto_index.h"
#include "crossknn/features.h"
#include "crossknn/index.h"
#include "crossknn/search.h"

namespace crossknn {

struct SearcherOptions {
  std::string round_index = "auto";  // "auto" (the index's: refused when FAISS) or "exact"
  double mix = 0.5;                  // AXN's weight of the DE query vector (Python DEFAULT_MIX)
  int threads = 0;                   // kernel threads (0: one per core); results never depend on it
};

struct SearchRequest {
  const float* query_vector = nullptr;  // the DE query vector (index dim floats), required
  int64_t k = 10;
  int64_t budget = 100;  // B: CE calls, never exceeded
  std::string method;    // "": the index's default (auto when it has auto's rows, else axn)
  int64_t rounds = 0;    // 0: the method's own (auto: the index's choice)
  uint64_t seed = 0;
  uint64_t query_id = 0;  // see "Query ids" above
  // the items the query may be given (mask_words(N) words, crossknn/features.h; null: all);
  // removed items are never allowed whatever the mask says
  const uint64_t* allow = nullptr;
  // the early stop (crossknn/search.h SearchOptions::stop_threshold): a query stops once its
  // top-k is likely found, at this Top-k-Recall target, with the threshold the index's build
  // calibrated (params.auto.stop_curve; Python's Searcher(target_recall=...)); 0: off (the
  // default, as in Python). Method auto only.
  double target_recall = 0.0;
};

struct Hits {
  std::vector<int64_t> indices;  // the top-k item positions, best first (fewer when fewer allowed)
  std::vector<float> scores;     // their CE scores
  int64_t ce_calls = 0;
  int64_t allowed = -1;  // with a mask or removed items: the items the query could be given
  std::vector<int64_t> scored_items;  // every item scored, in scoring order
  std::vector<float> scored_scores;
  std::string stopped = "budget";  // "budget", "found" (the early stop) or "allowed"
};

class Searcher {
 public:
  explicit Searcher(std::shared_ptr<const Index> index, SearcherOptions options = {});
  Hits search(Scorer& scorer, const SearchRequest& request) const;
  // The steps a search of `budget` CE calls runs (new items per step), as Python's plan_info
  std::vector<Step> plan(const std::string& method, int64_t budget, int64_t rounds = 0) const;
  const Index& index() const noexcept { return *index_; }
  const std::shared_ptr<const Index>& index_ptr() const noexcept { return index_; }

 private:
  std::shared_ptr<const Index> index_;
  SearcherOptions opt_;
  Features de_;  // the DE item vectors: the first stage, AXN's rounds
  double de_vmax_ = 0.0;
  std::shared_ptr<const Features> auto_x_, cur_, zeros_;
  std::shared_ptr<const AutoPrior> prior_;
  std::vector<double> auto_inv_;  // 1 / penalties, the free slope's last
  double cur_scale_ = 1.0;        // ADACUR's SoftMax temperature unit (CurIndex.score_scale)
};

}  // namespace crossknn
