// crossknn::Searcher over an index folder (crossknn/searcher.h): what Python's
// crossknn.search.engine.search_rounds hands the loop for each method, from the index's params.
#include "crossknn/searcher.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "index_settings.h"
#include "searcher_gar.h"

namespace crossknn {

namespace {

constexpr double kRhoFree = 1e-6;  // crossknn.search.auto.RHO_FREE
constexpr double kRhoQ = 1.0;      // crossknn.search.auto.RHO_Q
constexpr double kCurRidge = 1e-2;  // crossknn.search.methods.DEFAULT_RIDGE
constexpr int64_t kCurRounds = 5, kAxnRounds = 5;

Features de_view(const Index& idx, int threads) {
  const IndexArray& V = idx.array("de_items");
  // the map stays alive as long as the view (owner)
  return Features::view_float32(V.f32(), idx.n_items(), idx.dim(), threads, V.map, true);
}

double vmax_of(const float* V, int64_t n) {  // crossknn.core._view_vmax: max(V.max(), -V.min())
  float hi = V[0], lo = V[0];
  for (int64_t i = 1; i < n; ++i) {
    hi = std::max(hi, V[i]);
    lo = std::min(lo, V[i]);
  }
  return std::max(static_cast<double>(hi), -static_cast<double>(lo));
}

// Python's _round_plan(n, rounds, retrieve)
std::vector<Step> round_steps(int64_t n, int64_t rounds, int64_t retrieve) {
  const auto sizes = split_sizes(n, std::min(rounds, n));
  std::vector<Step> plan{{StepKind::First, sizes[0]}};
  for (size_t r = 1; r < sizes.size(); ++r) plan.push_back({StepKind::Round, sizes[r]});
  if (retrieve > 0) plan.push_back({StepKind::Retrieve, retrieve});
  return plan;
}

int64_t n_anchors(double split, int64_t budget) {  // Python _n_anchors (round half to even)
  const double r = std::nearbyint(split * static_cast<double>(budget));
  return std::min<int64_t>(budget, std::max<int64_t>(1, static_cast<int64_t>(r)));
}

[[noreturn]] void bad(const std::string& msg) { throw std::invalid_argument(msg); }

// NumPy's pairwise sum of float32 values (float32 accumulators: eight partial sums in blocks of
// up to 128, halves above), the sum behind ndarray.sum / mean / std of a float32 row
float pairwise_f32(const float* a, int64_t n) {
  if (n < 8) {
    float r = 0.0f;
    for (int64_t i = 0; i < n; ++i) r += a[i];
    return r;
  }
  if (n <= 128) {
    float r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_f32(a, n2) + pairwise_f32(a + n2, n - n2);
}

// crossknn.search.methods.CurIndex.score_scale: float(R.std(axis=1).mean()) of the float32
// rows R (kq x n), computed as NumPy does in float32; 1 when not > 0
double cur_score_scale(const float* R, int64_t kq, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n)), sd(static_cast<size_t>(kq));
  const float fn = static_cast<float>(n);
  for (int64_t j = 0; j < kq; ++j) {
    const float* row = R + j * n;
    const float mean = pairwise_f32(row, n) / fn;
    for (int64_t i = 0; i < n; ++i) {
      const float c = row[i] - mean;
      x[i] = c * c;
    }
    sd[j] = std::sqrt(pairwise_f32(x.data(), n) / fn);
  }
  const double s = static_cast<double>(pairwise_f32(sd.data(), kq) / static_cast<float>(kq));
  return s > 0.0 ? s : 1.0;
}

}  // namespace

Searcher::Searcher(std::shared_ptr<const Index> index, SearcherOptions options)
    : index_(std::move(index)), opt_(std::move(options)), de_(de_view(*index_, opt_.threads)) {
  if (opt_.round_index != "auto" && opt_.round_index != "exact")
    bad("round_index must be 'auto' or 'exact' in this C++ build (no FAISS); got '" +
        opt_.round_index + "'");
  if (!(opt_.mix >= 0.0 && opt_.mix <= 1.0)) bad("mix must be in [0, 1]");
  const Index& ix = *index_;
  const int64_t N = ix.n_items(), d = ix.dim();
  const float* V = ix.array("de_items").f32();
  de_vmax_ = vmax_of(V, N * d);
  if (!std::isfinite(de_vmax_)) bad("index " + ix.path() + ": de_items holds NaN or inf");
  std::vector<float> z(static_cast<size_t>(N), 0.0f);  // RNR's loop needs N (zeros N x 1)
  zeros_ = std::make_shared<const Features>(z.data(), N, 1, Storage::Float32, opt_.threads);
  const Index::Settings& st = ix.settings();
  if (st.has_cur) {  // ADACUR / ANNCUR features R^T (k_q x N rows -> N x k_q)
    const IndexArray& R = ix.array("R");
    if (R.shape.size() != 2 || R.shape[1] != N)
      bad("index " + ix.path() + ": R must be (train queries x " + std::to_string(N) + ")");
    const int64_t kq = R.shape[0];
    const float* r = R.f32();
    std::vector<float> RT(static_cast<size_t>(N * kq));
    for (int64_t q = 0; q < kq; ++q)
      for (int64_t i = 0; i < N; ++i) RT[i * kq + q] = r[q * N + i];
    cur_ = std::make_shared<const Features>(RT.data(), N, kq, Storage::Float32, opt_.threads);
    cur_scale_ = cur_score_scale(r, kq, N);
  }
  if (st.has_auto) {  // crossknn.index.auto.auto_index_of + AutoIndex / AUTO
    int64_t m = 0, r = 0;
    const float* R = nullptr;
    const float* A = nullptr;
    if (ix.has("auto_rows")) {
      const IndexArray& a = ix.array("auto_rows");
      m = a.count() / N;
      if (m * N != a.count()) bad("index " + ix.path() + ": auto_rows is not (m x N)");
      R = a.f32();
    }
    if (ix.has("auto_query_dirs")) {
      const IndexArray& a = ix.array("auto_query_dirs");
      if (a.shape.size() != 2 || a.shape[0] != d)
        bad("index " + ix.path() + ": auto_query_dirs must be (d x r)");
      r = a.shape[1];
      A = a.f32();
    }
    const std::vector<float> X = auto_features(V, N, d, R, m, A, r);
    auto_x_ = std::make_shared<const Features>(X.data(), N, d + m + r + 1, Storage::Float32,
                                               opt_.threads);
    AutoPriorSpec ps;
    ps.d = d;
    ps.m = m;
    ps.r = r;
    ps.alpha = st.prior_alpha;
    ps.tau = st.prior_tau;
    ps.ridge = st.prior_ridge;
    ps.kernel_tau = st.prior_kernel_tau;
    ps.V = V;
    ps.n = N;
    if (ix.has("auto_prior_deltas") && ix.has("auto_prior_vectors")) {
      const IndexArray& P = ix.array("auto_prior_vectors");
      ps.W = P.f32();
      ps.P = P.shape.empty() ? 0 : P.shape[0];
      ps.deltas = ix.array("auto_prior_deltas").f32();
    } else if (ix.has("auto_row_vectors")) {
      const IndexArray& W = ix.array("auto_row_vectors");
      ps.W = W.f32();
      ps.P = W.count() / d;
    }
    if (ix.has("auto_item_cov")) ps.cov = ix.array("auto_item_cov").f64();
    prior_ = std::make_shared<const AutoPrior>(ps);
    auto_inv_.reserve(static_cast<size_t>(d + m + r + 2));
    for (int64_t j = 0; j < d; ++j) auto_inv_.push_back(1.0 / st.rho_d);
    for (int64_t j = 0; j < m; ++j) auto_inv_.push_back(1.0 / st.rho_r);
    for (int64_t j = 0; j < r; ++j) auto_inv_.push_back(1.0 / kRhoQ);
    auto_inv_.push_back(1.0 / kRhoFree);
    auto_inv_.push_back(1.0 / kRhoFree);
  }
}

std::vector<Step> Searcher::plan(const std::string& method_in, int64_t budget,
                                 int64_t rounds) const {
  const Index& ix = *index_;
  const std::string method = method_in.empty() ? ix.default_method() : method_in;
  const auto have = ix.methods();
  if (method == "gar" && !ix.settings().has_gar_graph)
    bad("gar needs the index's corpus graph (gar_graph) made from its current de_items; index " +
        ix.path() + " has none, or an older one (items added or removed since the build): Python "
        "makes it at first use, C++ does not (the same graph needs numpy's sums); rebuild the "
        "index to search it with gar from C++");
  const bool cur_method = method == "adacur" || method == "adacur-split" ||
                          method == "adacur-random" || method == "adacur-softmax" ||
                          method == "anncur";
  if (cur_method && !ix.settings().has_cur)
    bad("method '" + method + "' needs a CUR index (CE scores of train queries x all items), "
        "which index " + ix.path() + " does not hold; build: crossknn build CORPUS INDEX_DIR "
        "--train-queries FILE --cur");
  if (std::find(have.begin(), have.end(), method) == have.end()) {
    std::string list;
    for (const auto& m : have) list += (list.empty() ? "" : ", ") + m;
    bad("method '" + method + "' is not served by index " + ix.path() + " from C++ (it serves " +
        list + ")");
  }
  if (budget < 1) bad("the budget must be >= 1 CE call; got " + std::to_string(budget));
  if (rounds < 0) bad("rounds must be >= 1 (0: the method's own); got " + std::to_string(rounds));
  const Index::Settings& st = ix.settings();
  if (method == "auto") {  // AUTO.plan with choose_rounds (no latency target: the index's)
    const int64_t R = std::min(rounds > 0 ? rounds : st.rounds, budget);
    int64_t n1 = 0;
    if (st.has_first_share) {
      const double r = std::nearbyint(st.first_share * static_cast<double>(budget));
      n1 = std::max<int64_t>(1, static_cast<int64_t>(r));
    }
    if (!st.has_first_share || R < 2 || budget - n1 < R - 1) return round_steps(budget, R, 0);
    std::vector<Step> plan{{StepKind::First, n1}};
    for (int64_t n : split_sizes(budget - n1, R - 1)) plan.push_back({StepKind::Round, n});
    return plan;
  }
  if (method == "rnr") return {{StepKind::First, budget}};
  if (method == "gar") {  // GAR.plan: batches of b, the last what is left
    std::vector<Step> plan;
    for (int64_t lo = 0; lo < budget; lo += detail::kGarBatch)
      plan.push_back({lo == 0 ? StepKind::First : StepKind::Round,
                      std::min(detail::kGarBatch, budget - lo)});
    return plan;
  }
  if (method == "anncur") {
    const int64_t ki = n_anchors(0.5, budget);
    std::vector<Step> plan{{StepKind::First, ki}};
    if (budget > ki) plan.push_back({StepKind::Retrieve, budget - ki});
    return plan;
  }
  const int64_t R = rounds > 0 ? rounds : (method == "axn" ? kAxnRounds : kCurRounds);
  if (R > budget)
    bad("rounds=" + std::to_string(R) + " exceeds the budget B=" + std::to_string(budget));
  if (method == "adacur-split") {
    const int64_t ki = n_anchors(0.5, budget);
    return round_steps(ki, R, budget - ki);
  }
  return round_steps(budget, R, 0);  // axn, adacur, adacur-random, adacur-softmax
}

Hits Searcher::search(Scorer& scorer, const SearchRequest& q) const {
  const Index& ix = *index_;
  const std::string method = q.method.empty() ? ix.default_method() : q.method;
  if (!q.query_vector) bad("the search needs the query's DE vector (query_vector)");
  const int64_t N = ix.n_items(), d = ix.dim();
  for (int64_t j = 0; j < d; ++j)
    if (!std::isfinite(q.query_vector[j]))
      bad("the DE query vector holds NaN or inf (value " + std::to_string(j) + ")");
  const std::vector<Step> plan = this->plan(method, q.budget, q.rounds);
  const Index::Settings& st = ix.settings();
  SearchOptions o;
  o.budget = q.budget;
  o.k = q.k;
  o.seed = q.seed;
  o.first_features = &de_;
  o.first_vmax = de_vmax_;
  const bool rounds = std::any_of(plan.begin(), plan.end(),
                                  [](const Step& s) { return s.kind != StepKind::First; });
  const Features* features = zeros_.get();
  std::vector<double> prior;
  if (method == "auto") {
    features = auto_x_.get();
    o.solve = rounds ? Solve::PriorRidge : Solve::LeastSquares;
    o.inv_penalties = auto_inv_;
    o.penalty_decay = st.decay;
    if (rounds) {
      std::vector<double> v(q.query_vector, q.query_vector + d);
      prior.resize(static_cast<size_t>(prior_->width()));
      prior_->prior(v.data(), prior.data());
    }
  } else if (method == "axn") {
    if (ix.round_index() != "exact" && opt_.round_index != "exact")
      bad("index " + ix.path() + " has a FAISS round index (" + ix.round_index() +
          ") for AXN's rounds, and this C++ build has no FAISS: search with "
          "SearcherOptions::round_index = \"exact\" for exact rounds (Python: "
          "Searcher(round_index=\"exact\")), never a silently different answer");
    features = &de_;
    if (opt_.mix > 0.0 && rounds) {
      o.mix = opt_.mix;
      prior.assign(q.query_vector, q.query_vector + d);
    }
    if (st.has_score_map) {
      o.score_alpha = st.score_scale;
      o.score_beta = st.score_offset;
    }
  } else if (method != "rnr") {  // the CUR methods over R^T
    features = cur_.get();
    o.ridge = kCurRidge;
    if (method == "adacur-random") o.strategy = Strategy::Random;
    if (method == "adacur-softmax") o.strategy = Strategy::SoftMax;
    if (method != "anncur") o.temperature = 1.0 * cur_scale_;  // ADACUR: 1 x the score scale
  }
  if (q.target_recall != 0.0) {  // crossknn.search.stopping.stop_threshold
    if (!(q.target_recall > 0.0 && q.target_recall <= 1.0))
      bad("target_recall must be in (0, 1]; got " + std::to_string(q.target_recall));
    if (method != "auto")
      bad("target_recall needs a method whose index calibrated the early stop (auto); '" +
          method + "' has none: search it without target_recall");
    if (st.stop_table.empty())
      bad("target_recall needs an index whose build calibrated the early stop (an auto index "
          "with at least 4 complete rows, built by this version); this one has none");
    // the calibrated budget nearest the budget in ratio (ties: the smaller), then the
    // calibrated target at or above the asked one
    const double b = static_cast<double>(std::max<int64_t>(q.budget, 1));
    const auto* near = &st.stop_table.front();
    double best = std::fabs(std::log(static_cast<double>(near->first) / b));
    for (const auto& e : st.stop_table) {
      const double dist = std::fabs(std::log(static_cast<double>(e.first) / b));
      if (dist < best || (dist == best && e.first < near->first)) {
        best = dist;
        near = &e;
      }
    }
    o.stop_threshold = 0.0;
    for (const auto& tv : near->second)
      if (tv.first >= q.target_recall - 1e-12) {
        o.stop_threshold = tv.second;
        break;
      }
  }
  // the allow mask: the caller's and the live items
  std::vector<uint64_t> mask;
  const uint64_t* allow = nullptr;
  if (q.allow || ix.live()) {
    const int64_t W = mask_words(N);
    mask.assign(static_cast<size_t>(W), ~uint64_t{0});
    for (int64_t w = 0; w < W; ++w) {
      if (q.allow) mask[w] &= q.allow[w];
      if (ix.live()) mask[w] &= ix.live()[w];
    }
    if (N & 63) mask[W - 1] &= (uint64_t{1} << (N & 63)) - 1;
    allow = mask.data();
  }
  if (method == "gar") {
    const IndexArray& g = ix.array("gar_graph");
    detail::GarGraph graph;
    graph.k = g.shape[1];
    if (g.dtype == "<i8")
      graph.g64 = g.i64();
    else
      graph.g32 = g.i32();
    return detail::gar_search(de_, de_vmax_, graph, scorer, q, allow);
  }
  SearchQuery sq;
  sq.id = q.query_id;
  sq.first_query = q.query_vector;
  sq.allow = allow;
  if (!prior.empty()) sq.prior = prior.data();
  SearchResult res = std::move(search_one(*features, scorer, plan, o, sq));
  Hits h;
  for (int64_t t = 0; t < q.k; ++t) {
    if (res.ids[t] < 0) break;
    h.indices.push_back(res.ids[t]);
    h.scores.push_back(res.scores[t]);
  }
  h.ce_calls = res.calls;
  h.stopped = res.stopped == StopReason::Found     ? "found"
              : res.stopped == StopReason::Allowed ? "allowed"
                                                   : "budget";
  if (allow) h.allowed = mask_count(allow, N);
  h.scored_items = std::move(res.scored_items);
  h.scored_scores = std::move(res.scored_scores);
  return h;
}

}  // namespace crossknn
