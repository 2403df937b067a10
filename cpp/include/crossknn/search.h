#pragma once
// crossknn/search.h: the round loop of adaptive k-NN search with an expensive exact scorer (a
// cross-encoder, CE) on a budget of B calls per query: the same loop as Python's
// crossknn.search.run_rounds, for the plans ADACUR and AXN use.
//
// A plan is a list of steps, each scoring `n` new items per query:
//   First    items that need no feedback: given by the caller (a first-stage retriever's top
//            items, fixed anchors) or uniform random (Features::sample_random, query seed);
//   Round    items chosen from the approximate scores V u among the items not scored yet, u the
//            least squares on the items scored so far (optionally mixed with a prior, lambda):
//            TopK, SoftMax (Gumbel-top-k, temperature T) or Random;
//   Retrieve the top approximate items not scored yet (last step of Split plans).
// The result is the top-k of all scored items by exact score (ties to the lower id).
//
// Budget accounting is exact: a query never gets more than B scorer calls, never the same item
// twice; a plan that would break either is refused before the first call. Randomness is keyed by
// (seed, query id) exactly as in Python (query_seed below), so a query gets the same items alone
// or in any batch, and the same items as the Python loop.
//
// Threads. search() is reentrant: concurrent calls (on the same Features) are safe; one call
// drives its scorer from the calling thread only, one step at a time. Exceptions thrown by the
// scorer propagate unchanged out of search(); bad input throws std::invalid_argument.

#include <cstdint>
#include <functional>
#include <vector>

#include "crossknn/features.h"

namespace crossknn {

enum class StepKind { First, Round, Retrieve };
enum class Strategy { TopK, SoftMax, Random };
// How a query's embedding u for the next step is solved from the items scored so far:
//   LeastSquares  crossknn/least_squares.h (ridge, refine), optionally mixed with a prior (mix);
//   Targets       u = the transformed scores themselves, in scoring order (ANNCUR with fixed
//                 anchors: features E^T, u = e_q); needs exactly d scored items;
//   PriorRidge    the ridge pulled to the prior (method `auto`): with p0 = the query's prior and
//                 Z = [X_A, X_A p0], (w, c) = argmin ||Z (w, c) - a||^2 + sum_j rho_j w_j^2 +
//                 rho_c c^2, computed in the dual: x = (s Z diag(1/rho) Z^T + I)^-1 a,
//                 (w, c) = s diag(1/rho) Z^T x, s = (|A| / 10)^decay; u = w + c p0 (u = p0 when
//                 nothing is scored). inv_penalties holds the d + 1 values 1/rho (slope last).
enum class Solve { LeastSquares, Targets, PriorRidge };

// A per-round hook for item selection over something other than the stored matrix (a MIPS
// index, item shards): Round/Retrieve steps call it instead of Features::top_k /
// sample_softmax. Random rounds, first items and rows still use the Features. Same contract as
// the Features calls it replaces (n distinct unmasked items, best first).
class RoundSelector {
 public:
  virtual ~RoundSelector() = default;
  virtual void top_k(const float* U, int64_t Q, int64_t n, const ExcludeLists& ex, float* keys,
                     int64_t* out) = 0;
  // one query: ex has offsets {0, m}; seed is the step's query seed
  virtual void sample_softmax(const float* u, int64_t n, const ExcludeLists& ex, double temperature,
                              uint64_t seed, float* keys, int64_t* out) = 0;
};

struct Step {
  StepKind kind = StepKind::First;
  int64_t n = 0;  // new items per query
};

// `n` items over `parts` rounds, as even as possible, larger rounds first (Python split_sizes).
std::vector<int64_t> split_sizes(int64_t n, int64_t parts);
// No-Split: the whole budget over `rounds` rounds (first round = First, then Round steps).
std::vector<Step> no_split_plan(int64_t budget, int64_t rounds);
// Split: k_i = round(split * budget) items over the rounds, then one Retrieve of the rest.
std::vector<Step> split_plan(int64_t budget, int64_t rounds, double split);

// The per-query seed of Python's crossknn.search.query_seed(seed, query_id) for integer ids:
// a 63-bit value from NumPy's SeedSequence([seed, query_id]).
uint64_t query_seed(uint64_t seed, uint64_t query_id) noexcept;

// One scorer call: exact scores of `m` items for query `query` (its position in the batch).
struct ScoreRequest {
  int64_t query = 0;
  const int64_t* items = nullptr;
  int64_t m = 0;
  float* out = nullptr;  // m scores to write
};

// The exact scorer (a CE, a score matrix, a remote service). The loop calls score_batch once per
// step with every query's new items (override it to batch the CE); the default calls score()
// for each request. Scores must be finite. A scorer object is used by one search() at a time.
class Scorer {
 public:
  virtual ~Scorer() = default;
  virtual void score(int64_t query, const int64_t* items, int64_t m, float* out) = 0;
  virtual void score_batch(const ScoreRequest* requests, int64_t n_requests);
};

// A Scorer over a callable (per-query calls).
class FunctionScorer final : public Scorer {
 public:
  using Fn = std::function<void(int64_t query, const int64_t* items, int64_t m, float* out)>;
  explicit FunctionScorer(Fn fn) : fn_(std::move(fn)) {}
  void score(int64_t query, const int64_t* items, int64_t m, float* out) override {
    fn_(query, items, m, out);
  }

 private:
  Fn fn_;
};

struct SearchOptions {
  int64_t budget = 100;                // B: scorer calls per query, never exceeded
  int64_t k = 10;                      // results per query (1 <= k <= B)
  Strategy strategy = Strategy::TopK;  // how Round steps choose (Retrieve is always TopK)
  double temperature = 1.0;            // SoftMax: probabilities ~ exp(V u / T)
  double ridge = 0.0;                  // least squares (see least_squares.h)
  int refine = 3;
  double jitter_rel = 1e-10;
  double mix = 0.0;  // lambda: u = (1 - mix) u_lstsq + mix prior; > 0 needs a prior per query
  uint64_t seed = 0;
  // targets of the least squares: (score - score_beta) / score_alpha (AXN's score normalization)
  double score_alpha = 1.0, score_beta = 0.0;
  Solve solve = Solve::LeastSquares;
  std::vector<double> inv_penalties;  // PriorRidge: d + 1 values 1/rho_j (> 0, finite)
  double penalty_decay = 0.0;         // PriorRidge: s = (|A| / 10)^decay
  // the papers' split variants: rank only the Retrieve step's items and the earlier items whose
  // approximate score (at the Retrieve step) reaches the lowest retrieved one
  bool final_retrieved = false;
  RoundSelector* selector = nullptr;  // not owned; nullptr: the Features' own kernels
  // A dense first stage inside the loop (a DE retriever): First steps score the top step.n items
  // of first_features (same items as `features`) by inner product with each query's
  // first_query, as crossknn.core.ItemFeatures.top_k does, including its power-of-two scaling
  // of a query whose float32 scores could overflow or sink into denormals (first_vmax: an upper
  // bound of max|first_features|, the Python object's). Not owned; nullptr: first_items or
  // uniform random items.
  const Features* first_features = nullptr;
  double first_vmax = 0.0;
  // Early stop (stop_chance below; off by default: every query runs the whole plan). Before a
  // Round/Retrieve step scores anything, a query whose estimated chance that the step changes
  // its top-k is below stop_threshold takes no more steps (SearchResult::stopped = Found): B
  // stays the ceiling, the calls not spent are simply not made. 0: never stop.
  double stop_threshold = 0.0;
  // record each query's estimate per step (SearchResult::stop_chance) even when not stopping
  // (calibration: one run at the full budget gives the result of every threshold)
  bool stop_trace = false;
};

// Why a query's search ended: it ran its whole plan (Budget), the early stop found its top-k
// (Found), or its allow mask allowed at most B items, all scored in one step (Allowed).
enum class StopReason { Budget, Found, Allowed };

// The estimate of the early stop for one query before a Round/Retrieve step (search.cpp):
//   s_k    the k-th best exact score so far, in the least squares' target scale
//          (score - score_beta) / score_alpha;
//   e      the out-of-sample errors of the approximate scores of the items the last rounds
//          chose (score - x_j u at the step that chose j; at least kStopMinErrors of them, the
//          most recent max(kStopWindow, n)): their mean mu and standard deviation sigma;
//   c_j    the approximate scores x_j u of the candidates: the max(n, kStopCandidates k) best
//          unscored items by approximate score (at most the calls left), an extra top-k pass
//          unless they are the step's own TopK choice;
//   chance = 1 - prod_j (1 - Phi((c_j + mu - s_k) / sigma)).
// NaN (no stop) with fewer than k items scored or fewer than max(kStopMinErrors,
// kStopCandidates k) errors in all (a first round's errors are biased: the solve after the first
// stage's items alone is poorly scaled).
constexpr int64_t kStopMinErrors = 4;
constexpr int64_t kStopWindow = 32;
constexpr int64_t kStopCandidates = 2;
double stop_chance(const double* candidates, int64_t n, double kth, const double* errors,
                   int64_t n_errors);

struct SearchQuery {
  uint64_t id = 0;                       // seeds: query_seed(options.seed, id)
  const int64_t* first_items = nullptr;  // plan[0].n items, or nullptr for uniform random
  const double* prior = nullptr;         // d doubles (the DE query vector): mix > 0 and PriorRidge
  const float* first_query = nullptr;    // first_features->dim() floats (options.first_features)
  // The items this query may be given: an allow mask (features.h, mask_words(N) words; nullptr:
  // every item). A disallowed item is never chosen, scored or returned; first_items must be
  // allowed. A mask that allows at most B items: they are all scored in the first step (one call
  // each, the exact top-k among them, no rounds); fewer than k: the result is padded with -1.
  const uint64_t* allow = nullptr;
};

struct SearchResult {
  std::vector<int64_t> ids;           // k ids by exact score descending, padded with -1
  std::vector<float> scores;          // their exact scores, padded with -inf
  int64_t calls = 0;                  // scorer calls spent (<= budget)
  std::vector<int64_t> scored_items;  // every item scored, in scoring order
  std::vector<float> scored_scores;
  StopReason stopped = StopReason::Budget;
  // with stop_threshold > 0 or stop_trace: the estimate before each step of the plan (NaN where
  // none was made: First steps, too little evidence, steps after the query stopped)
  std::vector<double> stop_chance;
};

// The query a dense first stage searches with: u (d floats) times the power of two 2^a that
// crossknn.core.ItemFeatures.top_k applies (a = 0 unless max|V| sum|u| is beyond 2^100 or below
// 2^-60, or max|u| beyond 2^+-120), rounded to float32. Throws on NaN/inf in u.
void scale_first_query(const float* u, int64_t d, double vmax, float* out);

// Runs `plan` for a batch of queries; one score_batch per step for all of them.
std::vector<SearchResult> search(const Features& features, Scorer& scorer,
                                 const std::vector<Step>& plan, const SearchOptions& options,
                                 const std::vector<SearchQuery>& queries);
// Wall time spent in each phase of search() by this process (all threads, summed), recorded only
// when CROSSKNN_PROFILE=1 is set in the environment at the first search (a benchmark aid; off,
// it costs one branch per phase). search_profile(true) returns the totals and zeroes them.
struct SearchProfile {
  double first = 0, solve = 0, select = 0, check = 0, score = 0, append = 0, final = 0;
  int64_t searches = 0;
};
SearchProfile search_profile(bool reset = false);

// One query (its scorer calls carry query index 0).
SearchResult search_one(const Features& features, Scorer& scorer, const std::vector<Step>& plan,
                        const SearchOptions& options, const SearchQuery& query = {});

}  // namespace crossknn
