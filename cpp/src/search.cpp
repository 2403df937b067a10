// The round loop (see crossknn/search.h): plans, query seeds, budget accounting.
#include "crossknn/search.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "clones.h"
#include "crossknn/least_squares.h"
#include "dots.h"
#include "features_impl.h"
#include "gram.h"
#include "kernels.h"
#include "scored_sets.h"

namespace crossknn {

namespace {

// CROSSKNN_PROFILE=1: per-phase wall time of search() (search_profile in search.h)
enum Phase { kFirst, kSolve, kSelect, kCheck, kScore, kAppend, kFinal, kPhases };
std::atomic<int64_t> g_phase_ns[kPhases];
std::atomic<int64_t> g_searches{0};

bool profiling() {
  static const bool on = [] {
    const char* e = std::getenv("CROSSKNN_PROFILE");
    return e && *e && std::strcmp(e, "0") != 0;
  }();
  return on;
}

// Adds the time since the last mark to a phase (nothing when profiling is off).
class PhaseClock {
 public:
  PhaseClock() : on_(profiling()) {
    if (on_) t_ = std::chrono::steady_clock::now();
  }
  void mark(Phase p) {
    if (!on_) return;
    const auto now = std::chrono::steady_clock::now();
    g_phase_ns[p].fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(now - t_).count(),
                            std::memory_order_relaxed);
    t_ = now;
  }

 private:
  bool on_;
  std::chrono::steady_clock::time_point t_;
};

}  // namespace

SearchProfile search_profile(bool reset) {
  auto get = [reset](Phase p) {
    const int64_t ns = reset ? g_phase_ns[p].exchange(0) : g_phase_ns[p].load();
    return static_cast<double>(ns) * 1e-9;
  };
  SearchProfile out;
  out.first = get(kFirst);
  out.solve = get(kSolve);
  out.select = get(kSelect);
  out.check = get(kCheck);
  out.score = get(kScore);
  out.append = get(kAppend);
  out.final = get(kFinal);
  out.searches = reset ? g_searches.exchange(0) : g_searches.load();
  return out;
}

void Scorer::score_batch(const ScoreRequest* requests, int64_t n_requests) {
  for (int64_t r = 0; r < n_requests; ++r)
    score(requests[r].query, requests[r].items, requests[r].m, requests[r].out);
}

std::vector<int64_t> split_sizes(int64_t n, int64_t parts) {
  if (parts <= 0) throw std::invalid_argument("rounds must be >= 1; got " + std::to_string(parts));
  if (n < parts)
    throw std::invalid_argument("cannot spread " + std::to_string(n) + " calls over " +
                                std::to_string(parts) + " rounds (rounds > budget)");
  std::vector<int64_t> out(static_cast<size_t>(parts), n / parts);
  for (int64_t r = 0; r < n % parts; ++r) ++out[r];
  return out;
}

namespace {

std::vector<Step> round_plan(int64_t n, int64_t rounds, int64_t retrieve) {
  const auto sizes = split_sizes(n, std::min(rounds, n));
  std::vector<Step> plan{{StepKind::First, sizes[0]}};
  for (size_t r = 1; r < sizes.size(); ++r) plan.push_back({StepKind::Round, sizes[r]});
  if (retrieve > 0) plan.push_back({StepKind::Retrieve, retrieve});
  return plan;
}

// NumPy SeedSequence (pool size 4) on a list of non-negative integers, 2 output words.
constexpr uint32_t kInitA = 0x43b0d7e5u, kMultA = 0x931e8875u, kInitB = 0x8b51f9ddu,
                   kMultB = 0x58f38dedu, kMixL = 0xca01f9ddu, kMixR = 0x4973f715u;

inline uint32_t hashmix(uint32_t value, uint32_t& hc) {
  value ^= hc;
  hc *= kMultA;
  value *= hc;
  value ^= value >> 16;
  return value;
}
inline uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixL * x - kMixR * y;
  r ^= r >> 16;
  return r;
}
// an integer as NumPy's _int_to_uint32_array: little-endian 32-bit words, [0] for zero
void push_words(uint64_t v, std::vector<uint32_t>& out) {
  if (v == 0) out.push_back(0);
  while (v > 0) {
    out.push_back(static_cast<uint32_t>(v & 0xffffffffu));
    v >>= 32;
  }
}

}  // namespace

std::vector<Step> no_split_plan(int64_t budget, int64_t rounds) {
  if (rounds < 1) throw std::invalid_argument("rounds must be >= 1; got " + std::to_string(rounds));
  if (rounds > budget)
    throw std::invalid_argument("rounds=" + std::to_string(rounds) +
                                " exceeds the budget B=" + std::to_string(budget));
  return round_plan(budget, rounds, 0);
}

std::vector<Step> split_plan(int64_t budget, int64_t rounds, double split) {
  if (!(split > 0.0 && split <= 1.0))
    throw std::invalid_argument(
        "split (fraction of the budget for the rounds) must be in (0, 1]; "
        "got " +
        std::to_string(split));
  if (rounds < 1) throw std::invalid_argument("rounds must be >= 1; got " + std::to_string(rounds));
  if (rounds > budget)
    throw std::invalid_argument("rounds=" + std::to_string(rounds) +
                                " exceeds the budget B=" + std::to_string(budget));
  // Python: int(min(budget, max(1, round(split * budget)))), round half to even
  const double r = std::nearbyint(split * static_cast<double>(budget));
  const int64_t k_i = std::min<int64_t>(budget, std::max<int64_t>(1, static_cast<int64_t>(r)));
  return round_plan(k_i, rounds, budget - k_i);
}

uint64_t query_seed(uint64_t seed, uint64_t query_id) noexcept {
  std::vector<uint32_t> entropy;
  push_words(seed, entropy);
  push_words(query_id, entropy);
  uint32_t pool[4];
  uint32_t hc = kInitA;
  for (size_t i = 0; i < 4; ++i) pool[i] = hashmix(i < entropy.size() ? entropy[i] : 0u, hc);
  for (size_t s = 0; s < 4; ++s)
    for (size_t d = 0; d < 4; ++d)
      if (s != d) pool[d] = mix(pool[d], hashmix(pool[s], hc));
  for (size_t s = 4; s < entropy.size(); ++s)
    for (size_t d = 0; d < 4; ++d) pool[d] = mix(pool[d], hashmix(entropy[s], hc));
  uint32_t state[2];
  uint32_t hb = kInitB;
  for (size_t i = 0; i < 2; ++i) {
    uint32_t v = pool[i % 4];
    v ^= hb;
    hb *= kMultB;
    v *= hb;
    v ^= v >> 16;
    state[i] = v;
  }
  return (static_cast<uint64_t>(state[0]) << 31) ^ static_cast<uint64_t>(state[1]);
}

namespace {

void check_plan(const std::vector<Step>& plan, const SearchOptions& o, int64_t n_items) {
  if (o.k < 1) throw std::invalid_argument("k must be >= 1; got " + std::to_string(o.k));
  if (o.budget < 1)
    throw std::invalid_argument("the budget must be >= 1 call; got " + std::to_string(o.budget));
  if (o.k > o.budget)
    throw std::invalid_argument("k=" + std::to_string(o.k) + " exceeds the budget B=" +
                                std::to_string(o.budget) + ": at most B items can be ranked");
  if (o.budget > n_items)
    throw std::invalid_argument("the budget B=" + std::to_string(o.budget) +
                                " exceeds the number of items (" + std::to_string(n_items) + ")");
  if (plan.empty()) throw std::invalid_argument("the plan is empty");
  if (plan[0].kind != StepKind::First)
    throw std::invalid_argument("a plan must start with a First step (nothing to solve on yet)");
  int64_t total = 0;
  for (size_t r = 0; r < plan.size(); ++r) {
    if (plan[r].n <= 0)
      throw std::invalid_argument("every step must score at least one item; step " +
                                  std::to_string(r) + " has n=" + std::to_string(plan[r].n));
    if (r > 0 && plan[r].kind == StepKind::First)
      throw std::invalid_argument("only step 0 may be a First step; step " + std::to_string(r) +
                                  " is one");
    total += plan[r].n;
  }
  if (total > o.budget)
    throw std::invalid_argument("the plan scores " + std::to_string(total) +
                                " items per query; the budget is " + std::to_string(o.budget));
  if (!(o.mix >= 0.0 && o.mix <= 1.0))
    throw std::invalid_argument("mix (lambda) must be in [0, 1]; got " + std::to_string(o.mix));
  if (!(o.temperature > 0.0) || !std::isfinite(o.temperature))
    throw std::invalid_argument("temperature must be a finite number > 0; got " +
                                std::to_string(o.temperature));
  if (!(o.stop_threshold >= 0.0 && o.stop_threshold <= 1.0))
    throw std::invalid_argument("stop_threshold (a chance) must be in [0, 1]; got " +
                                std::to_string(o.stop_threshold));
  if (!std::isfinite(o.score_alpha) || std::fabs(o.score_alpha) < 1e-12 ||
      !std::isfinite(o.score_beta))
    throw std::invalid_argument("score_alpha must be finite and non-zero, score_beta finite");
}

}  // namespace

namespace {

// w += Z^T x over the n rows z_a = [X_a, zd_a] (PriorRidge::solve; X float32, n x d): each w[j]
// sums its products in row order, so any vector width gives the same bits (clones.h); X_aj
// widened to double is the value the double copy held
CROSSKNN_CLONES_AVX512 void add_rows_times(const float* __restrict X, const double* __restrict zd,
                                           int64_t n, int64_t d, const double* __restrict x,
                                           double* __restrict w) {
  for (int64_t a = 0; a < n; ++a) {
    const float* __restrict z = X + a * d;
    const double xa = x[a];
    for (int64_t j = 0; j < d; ++j) w[j] += static_cast<double>(z[j]) * xa;
    w[d] += zd[a] * xa;
  }
}

// One query's PriorRidge state (Solve::PriorRidge in search.h). Rows z_a = [x_a, x_a . p0] are
// kept (x_a as float32, the values the features hold, and the slope feature x_a . p0 in double);
// K = Z diag(inv) Z^T grows by one row per scored item; with decay 0 the Cholesky factor of
// K + I grows with it (each step only factors the new rows). Storage for `capacity` scored items
// (the plan's total) is taken once: K and L keep that leading dimension, so that a step writes
// its new rows in place instead of re-laying the old ones out.
class PriorRidge {
 public:
  // wg: the kernel entries' cache for these penalties (gram.h), or nullptr
  PriorRidge(const Features& f, const double* prior, const std::vector<double>& inv, double decay,
             const detail::WeightedGram* wg, int64_t capacity)
      : f_(f),
        d_(f.dim()),
        p0_(prior, prior + f.dim()),
        inv_(inv),
        decay_(decay),
        wg_(wg),
        cap_(std::max<int64_t>(capacity, 1)),
        // not zeroed: an entry is written before it is read
        K_(new double[static_cast<size_t>(cap_ * cap_)]),
        L_(new double[static_cast<size_t>(cap_ * cap_)]),
        X_(new float[static_cast<size_t>(cap_ * d_)]),
        zd_(new double[static_cast<size_t>(cap_)]) {
    if (!wg_) {  // the kernel rows' dot products read the rows in double
      Z_.reset(new double[static_cast<size_t>(cap_ * (d_ + 1))]);
      zl_.reset(new double[static_cast<size_t>(cap_ * (d_ + 1))]);
    }
  }

  void append(const int64_t* items, const double* targets, int64_t m) {
    const int64_t D1 = d_ + 1, n0 = n_;
    if (n0 + m > cap_)  // the loop's budget accounting keeps a query within its plan
      throw std::logic_error("PriorRidge: " + std::to_string(n0 + m) +
                             " scored items exceed the plan's " + std::to_string(cap_));
    float* const X = X_.get();
    double* const zd = zd_.get();
    f_.rows(items, m, X + n0 * d_);
    for (int64_t t = 0; t < m; ++t) {
      // the slope feature x . p0
      zd[n0 + t] = detail::dot_pairwise(X + (n0 + t) * d_, p0_.data(), d_);
      a_.push_back(targets[t]);
    }
    items_.insert(items_.end(), items, items + m);
    n_ = n0 + m;
    // the new rows of K (lower triangle, leading dimension cap_): K_rb = (x_r o inv) . x_b
    // (dots(), Pairwise, over the d feature columns) + the slope's term (z_r o inv)_d (z_b)_d;
    // the first from the cache when there is one (the same bits), else groups of four rows on
    // threads
    double* K = K_.get();
    const int64_t ld = cap_;
    auto slope = [&](int64_t r, int64_t b) { return (zd[r] * inv_[d_]) * zd[b]; };
    if (wg_) {
      // lookups at random in an N x N table: the next row's entries are prefetched while this
      // row's are read, so that their cache misses overlap
      const int64_t N = f_.n_items();
      const double* m0 = wg_->m.data();
      for (int64_t b = 0; b <= n0; ++b) __builtin_prefetch(m0 + items_[n0] * N + items_[b]);
      for (int64_t r = n0; r < n_; ++r) {
        if (r + 1 < n_) {
          const double* mn = m0 + items_[r + 1] * N;
          for (int64_t b = 0; b <= r + 1; ++b) __builtin_prefetch(mn + items_[b]);
        }
        const double* mr = m0 + items_[r] * N;
        for (int64_t b = 0; b <= r; ++b) K[r * ld + b] = mr[items_[b]] + slope(r, b);
      }
      return;
    }
    double* const Z = Z_.get();
    double* const zl = zl_.get();
    for (int64_t r = n0; r < n_; ++r) {
      double* z = Z + r * D1;
      for (int64_t j = 0; j < d_; ++j) z[j] = static_cast<double>(X[r * d_ + j]);
      z[d_] = zd[r];
      for (int64_t j = 0; j < D1; ++j) zl[(r - n0) * D1 + j] = z[j] * inv_[j];
    }
    const int64_t n_groups = (m + 3) / 4;
    const int T = static_cast<double>(m) * n_ * D1 < 3e7 ? 1 : f_.threads();
    detail::parallel_for(T, n_groups, [&](int, int64_t g) {
      const int64_t g0 = n0 + 4 * g, g1 = std::min(n_, g0 + 4);
      const double* a[4];
      double out[4];
      // the old rows b < g0 two at a time (every row of the group against both: twice the
      // independent sums, the same bits), then the group's own triangle one b at a time
      const int ng = static_cast<int>(g1 - g0);
      for (int t = 0; t < ng; ++t) a[t] = zl + (g0 + t - n0) * D1;
      int64_t b = 0;
      double out1[4];
      for (; b + 1 < g0; b += 2) {
        detail::dots2v(detail::DotOrder::Pairwise, a, ng, Z + b * D1, Z + (b + 1) * D1, d_, out,
                       out1);
        for (int t = 0; t < ng; ++t) {
          K[(g0 + t) * ld + b] = out[t] + slope(g0 + t, b);
          K[(g0 + t) * ld + b + 1] = out1[t] + slope(g0 + t, b + 1);
        }
      }
      for (; b < g1; ++b) {
        int na = 0;
        int64_t first = std::max(g0, b);
        for (int64_t r = first; r < g1; ++r) a[na++] = zl + (r - n0) * D1;
        detail::dots(detail::DotOrder::Pairwise, a, na, Z + b * D1, d_, out);
        for (int t = 0; t < na; ++t) K[(first + t) * ld + b] = out[t] + slope(first + t, b);
      }
    });
  }

  void solve(double* u) {
    if (n_ == 0) {
      std::copy(p0_.begin(), p0_.end(), u);
      return;
    }
    const double s = decay_ != 0.0 ? std::pow(static_cast<double>(n_) / 10.0, decay_) : 1.0;
    if (decay_ != 0.0 || lsize_ != n_) factor(s);
    // L L^T x = a
    const int64_t ld = cap_;
    const double* L = L_.get();
    std::vector<double> x(a_);
    for (int64_t i = 0; i < n_; ++i) {
      double v = x[i];
      for (int64_t j = 0; j < i; ++j) v -= L[i * ld + j] * x[j];
      x[i] = v / L[i * ld + i];
    }
    for (int64_t i = n_ - 1; i >= 0; --i) {
      double v = x[i];
      for (int64_t j = i + 1; j < n_; ++j) v -= L[j * ld + i] * x[j];
      x[i] = v / L[i * ld + i];
    }
    const int64_t D1 = d_ + 1;
    std::vector<double> w(static_cast<size_t>(D1), 0.0);
    add_rows_times(X_.get(), zd_.get(), n_, d_, x.data(), w.data());
    for (int64_t j = 0; j < D1; ++j) w[j] *= s * inv_[j];
    for (int64_t j = 0; j < d_; ++j) u[j] = w[j] + w[d_] * p0_[j];
  }

 private:
  // Cholesky of s K + I: incremental from the rows factored so far when s == 1 (decay 0)
  void factor(double s) {
    const int64_t done = (decay_ == 0.0 && lsize_ > 0) ? lsize_ : 0;
    const int64_t ld = cap_;
    double* L = L_.get();
    const double* K = K_.get();
    // rows >= done over the columns < done: independent rows, groups of four on threads
    const int64_t nn = n_ - done, n_groups = (nn + 3) / 4;
    const int T = static_cast<double>(nn) * done * done < 3e7 ? 1 : f_.threads();
    if (done > 0)
      detail::parallel_for(T, n_groups, [&](int, int64_t g) {
        const int64_t g0 = done + 4 * g, g1 = std::min(n_, g0 + 4);
        const int na = static_cast<int>(g1 - g0);
        const double* a[4];
        double out[4];
        for (int t = 0; t < na; ++t) a[t] = L + (g0 + t) * ld;
        for (int64_t j = 0; j < done; ++j) {
          const double* lj = L + j * ld;
          detail::dots(detail::DotOrder::Pairwise, a, na, lj, j, out);
          for (int t = 0; t < na; ++t) {
            const int64_t i = g0 + t;
            L[i * ld + j] = (s * K[i * ld + j] + 0.0 - out[t]) / lj[j];  // as below
          }
        }
      });
    for (int64_t i = done; i < n_; ++i) {
      for (int64_t j = done > 0 ? done : 0; j <= i; ++j) {
        const double v = s * K[i * ld + j] + (i == j ? 1.0 : 0.0) -
                         detail::dot_pairwise(L + i * ld, L + j * ld, j);
        if (i == j) {
          // s K + I has eigenvalues >= 1: v > 0 up to rounding; keep it positive
          L[i * ld + i] = std::sqrt(std::max(v, 1e-300));
        } else {
          L[i * ld + j] = v / L[j * ld + j];
        }
      }
    }
    lsize_ = n_;
  }

  Features f_;
  int64_t d_;
  std::vector<double> p0_, inv_;
  double decay_;
  const detail::WeightedGram* wg_;
  int64_t cap_;
  int64_t n_ = 0, lsize_ = 0;
  std::unique_ptr<double[]> K_, L_;  // cap_ x cap_, lower triangles
  // rows x_a (cap_ x d float32) and their slope features; without the cache the rows z_a in
  // double (cap_ x (d + 1)) and this step's z_r o inv: written before read, never zeroed
  std::unique_ptr<float[]> X_;
  std::unique_ptr<double[]> zd_, Z_, zl_;
  std::vector<double> a_;
  std::vector<int64_t> items_;
};

}  // namespace

double stop_chance(const double* candidates, int64_t n, double kth, const double* errors,
                   int64_t n_errors) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (n_errors < kStopMinErrors || !std::isfinite(kth)) return nan;
  double mu = 0.0;
  for (int64_t t = 0; t < n_errors; ++t) mu += errors[t];
  mu /= static_cast<double>(n_errors);
  double var = 0.0;
  for (int64_t t = 0; t < n_errors; ++t) var += (errors[t] - mu) * (errors[t] - mu);
  const double sigma =
      std::max(std::sqrt(var / static_cast<double>(n_errors - 1)), 1e-12 * (1.0 + std::fabs(kth)));
  double log_keep = 0.0;  // log of the chance that no candidate passes s_k
  for (int64_t j = 0; j < n; ++j) {
    const double p = 0.5 * std::erfc(-(candidates[j] + mu - kth) / (sigma * std::sqrt(2.0)));
    if (p >= 1.0) return 1.0;
    log_keep += std::log1p(-p);
  }
  return -std::expm1(log_keep);
}

// crossknn.core's query scaling constants (_SCORE_EXP, _U_EXP, _LOW_EXP, _TARGET_EXP)
constexpr double kScoreExp = 100, kLowExp = -60, kTargetExp = 64;
constexpr int kUExp = 120;

void scale_first_query(const float* u, int64_t d, double vmax, float* out) {
  double amax = 0.0;
  for (int64_t j = 0; j < d; ++j) {
    const double v = static_cast<double>(u[j]);
    if (!std::isfinite(v))
      throw std::invalid_argument("a first-stage query vector contains NaN or inf");
    amax = std::max(amax, std::fabs(v));
  }
  int a = 0;
  if (amax > 0.0) {
    int e_u = 0;
    std::frexp(amax, &e_u);
    double lb = -std::numeric_limits<double>::infinity();
    if (vmax > 0.0) {
      double s = 0.0;
      for (int64_t j = 0; j < d; ++j) s += std::fabs(std::ldexp(static_cast<double>(u[j]), -e_u));
      lb = std::log2(vmax * s) + e_u;
    }
    const bool low = lb < kLowExp && std::isfinite(lb);
    if (lb > kScoreExp || low || e_u > kUExp || e_u < -kUExp)
      a = static_cast<int>(std::min(kTargetExp - std::ceil(lb), static_cast<double>(kUExp - e_u)));
  }
  for (int64_t j = 0; j < d; ++j)
    out[j] = static_cast<float>(std::ldexp(static_cast<double>(u[j]), a));
}

std::vector<SearchResult> search(const Features& features, Scorer& scorer,
                                 const std::vector<Step>& plan, const SearchOptions& o,
                                 const std::vector<SearchQuery>& queries) {
  const int64_t n_items = features.n_items(), d = features.dim();
  const int64_t Q = static_cast<int64_t>(queries.size());
  check_plan(plan, o, n_items);
  for (int64_t i = 0; i < Q; ++i)
    if ((o.mix > 0.0 || o.solve == Solve::PriorRidge) && !queries[i].prior)
      throw std::invalid_argument(
          "mix > 0 (or the PriorRidge solve) needs a prior for every query; query " +
          std::to_string(i) + " has none");
  if (o.solve == Solve::PriorRidge) {
    if (static_cast<int64_t>(o.inv_penalties.size()) != d + 1)
      throw std::invalid_argument("the PriorRidge solve needs d + 1 = " + std::to_string(d + 1) +
                                  " inverse penalties; got " +
                                  std::to_string(o.inv_penalties.size()));
    for (double v : o.inv_penalties)
      if (!(v > 0.0) || !std::isfinite(v))
        throw std::invalid_argument("inverse penalties must be finite and > 0; got " +
                                    std::to_string(v));
    if (!std::isfinite(o.penalty_decay))
      throw std::invalid_argument("penalty_decay must be finite");
  }
  if (o.first_features) {
    if (o.first_features->n_items() != n_items)
      throw std::invalid_argument("the first stage has " +
                                  std::to_string(o.first_features->n_items()) +
                                  " items but the features " + std::to_string(n_items));
    if (!(o.first_vmax >= 0.0) || !std::isfinite(o.first_vmax))
      throw std::invalid_argument("first_vmax must be finite and >= 0; got " +
                                  std::to_string(o.first_vmax));
    for (int64_t i = 0; i < Q; ++i)
      if (!queries[i].first_query || queries[i].first_items)
        throw std::invalid_argument(
            "a dense first stage needs a first_query (and no first_items) for every query; "
            "query " +
            std::to_string(i) + (queries[i].first_items ? " has first_items" : " has none"));
  }
  std::vector<SearchResult> res(static_cast<size_t>(Q));
  if (Q == 0) return res;
  PhaseClock clock;
  if (profiling()) g_searches.fetch_add(1, std::memory_order_relaxed);

  // allow masks: a query whose mask allows at most B items scores them all in the first step
  // (its exact top-k, one call per allowed item) and takes no rounds; the others ("act") run
  // the plan, every kernel choosing among their allowed items only
  std::vector<const uint64_t*> allow(static_cast<size_t>(Q));
  std::vector<int64_t> n_allowed(static_cast<size_t>(Q));
  std::vector<char> small(static_cast<size_t>(Q), 0);
  std::vector<int64_t> act;
  bool masked = false;
  for (int64_t i = 0; i < Q; ++i) {
    allow[i] = queries[i].allow;
    n_allowed[i] = mask_count(allow[i], n_items);
    masked = masked || allow[i] != nullptr;
    small[i] = allow[i] != nullptr && n_allowed[i] <= o.budget;
    if (!small[i]) act.push_back(i);
  }
  int64_t Qa = static_cast<int64_t>(act.size());  // shrinks as queries stop early
  std::vector<const uint64_t*> allow_act(static_cast<size_t>(Qa));
  for (int64_t a = 0; a < Qa; ++a) allow_act[a] = allow[act[a]];
  const uint64_t* const* allow_act_p = masked ? allow_act.data() : nullptr;
  auto allow_one = [&](int64_t a) -> const uint64_t* const* {
    return masked ? allow_act.data() + a : nullptr;
  };

  std::vector<uint64_t> seeds(static_cast<size_t>(Q));
  for (int64_t i = 0; i < Q; ++i) seeds[i] = query_seed(o.seed, queries[i].id);
  const bool rounds = std::any_of(plan.begin(), plan.end(),
                                  [](const Step& s) { return s.kind != StepKind::First; });
  // the last step that solves: scores of later steps never reach a solve, so they are not
  // appended to the solver states (the result is the same; the work is not)
  size_t last_solve = 0;
  for (size_t r = 0; r < plan.size(); ++r)
    if (plan[r].kind != StepKind::First) last_solve = r;
  std::vector<LeastSquares> states;
  // the item Gram cache (gram.h): built once max(64, N / 8) searches with least-squares rounds
  // have run on these features (or by Features::prepare_gram); a round's top-k goes through it
  // for queries in the dual regime without a prior while it reads fewer bytes than the int8
  // pass (8 |A| <= d)
  const detail::ItemGram* gram = nullptr;
  if (rounds && Qa > 0 && o.solve == Solve::LeastSquares && features.gram()) {
    const detail::FeatureData& fd = detail::data(features);
    const int64_t calls = fd.ls_searches.fetch_add(1, std::memory_order_relaxed) + 1;
    gram = calls >= std::max<int64_t>(64, n_items / 8) ? detail::build_gram(fd, features.threads())
                                                       : detail::ready_gram(fd);
  }
  std::vector<std::vector<double>> coefs(gram ? static_cast<size_t>(Q) : 0);
  std::vector<double> coef_err(gram ? static_cast<size_t>(Q) : 0);
  std::vector<char> in_span(gram ? static_cast<size_t>(Q) : 0);
  std::vector<double> u_span(gram ? static_cast<size_t>(Q * d) : 0);  // u before float32
  std::vector<PriorRidge> ridges;
  const detail::WeightedGram* wgram =  // PriorRidge's cache (Features::prepare_gram(inv))
      rounds && o.solve == Solve::PriorRidge && features.gram()
          ? detail::ready_weighted_gram(detail::data(features), o.inv_penalties.data())
          : nullptr;
  std::vector<std::vector<double>> targets_of;  // Solve::Targets
  if (rounds && o.solve == Solve::LeastSquares) {
    states.reserve(static_cast<size_t>(Q));
    for (int64_t i = 0; i < Q; ++i) {
      states.emplace_back(features, o.ridge, o.refine, o.jitter_rel);
      if (o.mix > 0.0) states.back().set_prior(queries[i].prior, o.mix);
    }
  } else if (rounds && o.solve == Solve::PriorRidge) {
    ridges.reserve(static_cast<size_t>(Q));
    int64_t planned = 0;  // items the plan scores per query (PriorRidge's storage)
    for (const Step& st : plan) planned += st.n;
    for (int64_t i = 0; i < Q; ++i)
      ridges.emplace_back(features, queries[i].prior, o.inv_penalties, o.penalty_decay, wgram,
                          small[i] ? 1 : planned);
  } else if (rounds) {
    targets_of.resize(static_cast<size_t>(Q));
  }
  detail::ScoredSets seen(Q, n_items);
  // final_retrieved: the items each query ranks at the end (empty: every scored item)
  std::vector<std::unordered_set<int64_t>> ranked(static_cast<size_t>(Q));
  std::vector<char> use_ranked(static_cast<size_t>(Q), 0);
  std::vector<double> rowbuf;

  // chosen: the step's items of the act queries (Qa x n); items / offs: every query's new items
  std::vector<int64_t> chosen, ex_ids, ex_off, items, offs;
  std::vector<float> U, keys, new_scores;
  std::vector<double> u(static_cast<size_t>(d)), targets;
  // early stop (stop_chance): per query, whether it stopped, the approximate scores (score
  // scale) of the items its current step chose, and the out-of-sample errors of earlier steps
  const bool stop_on = o.stop_threshold > 0.0 || o.stop_trace;
  std::vector<char> done(static_cast<size_t>(Q), 0);
  std::vector<std::vector<double>> pred(stop_on ? static_cast<size_t>(Q) : 0),
      errs(stop_on ? static_cast<size_t>(Q) : 0);
  std::vector<double> cand;
  std::vector<int64_t> cand_ids;
  std::vector<float> cand_keys, kth_buf;
  for (int64_t i = 0; i < Q; ++i) {
    if (small[i]) res[i].stopped = StopReason::Allowed;
    if (stop_on)
      res[i].stop_chance.assign(plan.size(), std::numeric_limits<double>::quiet_NaN());
  }
  for (size_t r = 0; r < plan.size(); ++r) {
    const Step& step = plan[r];
    const int64_t n = step.n;
    if (r > 0 && stop_on) {  // the queries that stopped in the last step take no more steps
      act.erase(std::remove_if(act.begin(), act.end(), [&](int64_t i) { return done[i] != 0; }),
                act.end());
      Qa = static_cast<int64_t>(act.size());
      allow_act.resize(static_cast<size_t>(Qa));
      for (int64_t a = 0; a < Qa; ++a) allow_act[a] = allow[act[a]];
      allow_act_p = masked ? allow_act.data() : nullptr;
    }
    if (r > 0 && Qa == 0) break;  // every query scored its allowed items or stopped
    chosen.assign(static_cast<size_t>(Qa * n), -1);
    if (step.kind == StepKind::First && o.first_features && Qa > 0) {
      // the DE's top items (crossknn.retrievers.DenseRetriever.retrieve), all queries at once
      const int64_t d1 = o.first_features->dim();
      U.resize(static_cast<size_t>(Qa * d1));
      for (int64_t a = 0; a < Qa; ++a)
        scale_first_query(queries[act[a]].first_query, d1, o.first_vmax, U.data() + a * d1);
      keys.resize(static_cast<size_t>(Qa * n));
      o.first_features->top_k(U.data(), Qa, n, ExcludeLists{nullptr, nullptr, allow_act_p},
                              keys.data(), chosen.data());
      clock.mark(kFirst);
    } else if (step.kind == StepKind::First) {
      for (int64_t a = 0; a < Qa; ++a) {
        const int64_t i = act[a];
        if (queries[i].first_items)
          std::copy(queries[i].first_items, queries[i].first_items + n, chosen.begin() + a * n);
        else
          features.sample_random(1, n, ExcludeLists{nullptr, nullptr, allow_one(a)}, seeds[i],
                                 chosen.data() + a * n);
      }
      clock.mark(kFirst);
    } else {
      U.resize(static_cast<size_t>(Qa * d));
      for (int64_t a = 0; a < Qa; ++a) {
        const int64_t i = act[a];
        if (o.solve == Solve::LeastSquares && gram) {
          coefs[i].resize(static_cast<size_t>(states[i].size()));
          in_span[i] = states[i].solve_dual(u.data(), coefs[i].data(), &coef_err[i]) &&
                       8 * states[i].size() <= d;
          std::copy(u.begin(), u.end(), u_span.begin() + i * d);
        } else if (o.solve == Solve::LeastSquares) {
          states[i].solve(u.data());
        } else if (o.solve == Solve::PriorRidge) {
          ridges[i].solve(u.data());
        } else {
          if (static_cast<int64_t>(targets_of[i].size()) != d)
            throw std::invalid_argument("the Targets solve needs exactly d = " + std::to_string(d) +
                                        " scored items before a round; query " + std::to_string(i) +
                                        " has " + std::to_string(targets_of[i].size()));
          std::copy(targets_of[i].begin(), targets_of[i].end(), u.begin());
        }
        for (int64_t j = 0; j < d; ++j) U[a * d + j] = static_cast<float>(u[j]);
      }
      clock.mark(kSolve);
      ex_ids.clear();
      ex_off.assign(1, 0);
      for (int64_t a = 0; a < Qa; ++a) {
        const auto& sc = res[act[a]].scored_items;
        ex_ids.insert(ex_ids.end(), sc.begin(), sc.end());
        ex_off.push_back(static_cast<int64_t>(ex_ids.size()));
      }
      const Strategy strategy = step.kind == StepKind::Retrieve ? Strategy::TopK : o.strategy;
      keys.resize(static_cast<size_t>(Qa * n));
      if (strategy == Strategy::TopK) {
        const ExcludeLists ex{ex_ids.data(), ex_off.data(), allow_act_p};
        const bool by_gram =
            gram && !o.selector &&
            std::all_of(act.begin(), act.end(), [&](int64_t i) { return in_span[i] != 0; });
        if (o.selector) {
          o.selector->top_k(U.data(), Qa, n, ex, keys.data(), chosen.data());
        } else if (by_gram) {
          for (int64_t a = 0; a < Qa; ++a) {
            const int64_t i = act[a];
            const int64_t off1[2] = {0, ex_off[a + 1] - ex_off[a]};
            const ExcludeLists ex1{ex_ids.data() + ex_off[a], off1, allow_one(a)};
            const std::vector<int64_t> span = states[i].items();
            if (!detail::gram_top_k(detail::data(features), *gram, U.data() + a * d,
                                    u_span.data() + i * d, span.data(), coefs[i].data(),
                                    static_cast<int64_t>(span.size()), coef_err[i], n, ex1,
                                    keys.data() + a * n, chosen.data() + a * n))
              features.top_k(U.data() + a * d, 1, n, ex1, keys.data() + a * n,
                             chosen.data() + a * n);
          }
        } else {
          features.top_k(U.data(), Qa, n, ex, keys.data(), chosen.data());
        }
      } else {
        for (int64_t a = 0; a < Qa; ++a) {
          const int64_t i = act[a];
          // one query (row 0, as Python's single calls): offsets {0, m} over its own ids
          const int64_t off1[2] = {0, ex_off[a + 1] - ex_off[a]};
          const ExcludeLists ex1{ex_ids.data() + ex_off[a], off1, allow_one(a)};
          const uint64_t rs = query_seed(seeds[i], static_cast<uint64_t>(r));
          if (strategy == Strategy::SoftMax && o.selector)
            o.selector->sample_softmax(U.data() + a * d, n, ex1, o.temperature, rs,
                                       keys.data() + a * n, chosen.data() + a * n);
          else if (strategy == Strategy::SoftMax)
            features.sample_softmax(U.data() + a * d, 1, n, ex1, o.temperature, rs,
                                    keys.data() + a * n, chosen.data() + a * n);
          else
            features.sample_random(1, n, ex1, rs, chosen.data() + a * n);
        }
      }
      if (stop_on) {
        // the early stop's test (stop_chance): the step's candidates against the k-th exact
        // score, with the errors of the earlier steps' approximate scores (all in score scale)
        auto approx = [&](int64_t a, const int64_t* its, int64_t m, std::vector<double>& out) {
          rowbuf.resize(static_cast<size_t>(m * d));
          features.rows(its, m, rowbuf.data());
          out.assign(static_cast<size_t>(m), 0.0);
          const float* ua = U.data() + a * d;
          for (int64_t t = 0; t < m; ++t) {
            double acc = 0.0;
            for (int64_t j = 0; j < d; ++j) acc += rowbuf[t * d + j] * static_cast<double>(ua[j]);
            out[t] = o.score_alpha * acc + o.score_beta;
          }
        };
        for (int64_t a = 0; a < Qa; ++a) {
          const int64_t i = act[a];
          approx(a, chosen.data() + a * n, n, pred[i]);
          const auto& sc = res[i].scored_scores;
          const int64_t m_sc = static_cast<int64_t>(sc.size());
          const int64_t n_err = static_cast<int64_t>(errs[i].size());
          if (m_sc < o.k || n_err < std::max(kStopMinErrors, kStopCandidates * o.k)) continue;
          kth_buf.assign(sc.begin(), sc.end());
          std::nth_element(kth_buf.begin(), kth_buf.begin() + (o.k - 1), kth_buf.end(),
                           std::greater<float>());
          const double kth = kth_buf[o.k - 1];
          // the candidates: the max(n, kStopCandidates k) best unscored items, within the budget
          const int64_t nc = std::max<int64_t>(
              1, std::min(o.budget - res[i].calls, std::max(n, kStopCandidates * o.k)));
          if (strategy == Strategy::TopK && nc == n) {
            cand = pred[i];
          } else {  // the nc best unscored items by approximate score
            const int64_t off1[2] = {0, ex_off[a + 1] - ex_off[a]};
            const ExcludeLists ex1{ex_ids.data() + ex_off[a], off1, allow_one(a)};
            cand_ids.assign(static_cast<size_t>(nc), -1);
            cand_keys.resize(static_cast<size_t>(nc));
            if (o.selector)
              o.selector->top_k(U.data() + a * d, 1, nc, ex1, cand_keys.data(), cand_ids.data());
            else
              features.top_k(U.data() + a * d, 1, nc, ex1, cand_keys.data(), cand_ids.data());
            int64_t got = 0;
            while (got < nc && cand_ids[got] >= 0) ++got;
            approx(a, cand_ids.data(), got, cand);
          }
          const int64_t w = std::min(n_err, std::max(kStopWindow, n));
          const double chance = stop_chance(cand.data(), static_cast<int64_t>(cand.size()), kth,
                                            errs[i].data() + (n_err - w), w);
          res[i].stop_chance[r] = chance;
          if (chance < o.stop_threshold) {  // NaN: no stop
            done[i] = 1;
            res[i].stopped = StopReason::Found;
          }
        }
      }
      if (step.kind == StepKind::Retrieve && o.final_retrieved) {
        // rank the retrieved items and the earlier ones whose approximate score reaches the
        // lowest retrieved one (approximate scores in double, as the Python reference)
        for (int64_t a = 0; a < Qa; ++a) {
          const int64_t i = act[a];
          if (done[i]) continue;  // stopped before this step: every scored item is ranked
          use_ranked[i] = 1;
          const float* ui = U.data() + a * d;
          auto approx = [&](const int64_t* its, int64_t m, std::vector<double>& out) {
            rowbuf.resize(static_cast<size_t>(m * d));
            features.rows(its, m, rowbuf.data());
            out.assign(static_cast<size_t>(m), 0.0);
            for (int64_t t = 0; t < m; ++t) {
              double acc = 0.0;
              for (int64_t j = 0; j < d; ++j) acc += rowbuf[t * d + j] * static_cast<double>(ui[j]);
              out[t] = acc;
            }
          };
          std::vector<double> a_ret, a_prev;
          approx(chosen.data() + a * n, n, a_ret);
          const auto& prev = res[i].scored_items;
          approx(prev.data(), static_cast<int64_t>(prev.size()), a_prev);
          double floor = std::numeric_limits<double>::infinity();
          for (double v : a_ret) floor = std::min(floor, v);
          ranked[i].insert(chosen.begin() + a * n, chosen.begin() + (a + 1) * n);
          for (size_t t = 0; t < prev.size(); ++t)
            if (a_prev[t] >= floor) ranked[i].insert(prev[t]);
        }
      }
      clock.mark(kSelect);
    }
    // every query's new items: the act queries' step items, a small query's allowed items
    items.clear();
    offs.assign(1, 0);
    for (int64_t i = 0, a = 0; i < Q; ++i) {
      if (small[i]) {
        if (r == 0) {
          const int64_t before = static_cast<int64_t>(items.size());
          const int64_t words = mask_words(n_items);
          for (int64_t w = 0; w < words; ++w) {
            uint64_t bits = allow[i][w];
            if (w == words - 1 && (n_items & 63)) bits &= (uint64_t{1} << (n_items & 63)) - 1;
            for (; bits; bits &= bits - 1) items.push_back(w * 64 + __builtin_ctzll(bits));
          }
          if (static_cast<int64_t>(items.size()) - before != n_allowed[i])
            throw std::logic_error("search: the allowed items of query " + std::to_string(i) +
                                   " changed while it was searched");
        }
      } else if (a < Qa && act[a] == i) {
        if (!done[i])
          items.insert(items.end(), chosen.begin() + a * n, chosen.begin() + (a + 1) * n);
        ++a;
      }
      offs.push_back(static_cast<int64_t>(items.size()));
    }
    // budget accounting: every item new, distinct, in range, allowed, within B (marked scored
    // here: a step that fails a check ends the search)
    for (int64_t i = 0; i < Q; ++i) {
      const int64_t m = offs[i + 1] - offs[i];
      if (res[i].calls + m > o.budget)
        throw std::invalid_argument("query " + std::to_string(i) + ": step " + std::to_string(r) +
                                    " would exceed the budget B=" + std::to_string(o.budget));
      for (int64_t t = offs[i]; t < offs[i + 1]; ++t) {
        const int64_t it = items[t];
        if (it < 0 || it >= n_items)
          throw std::invalid_argument("query " + std::to_string(i) + ": first item " +
                                      std::to_string(it) + " is outside [0, " +
                                      std::to_string(n_items) + ")");
        if (!mask_allows(allow[i], it))
          throw std::invalid_argument("query " + std::to_string(i) + ": step " + std::to_string(r) +
                                      " chose item " + std::to_string(it) +
                                      ", which the query's allow mask excludes");
        if (!seen.insert(i, it))
          throw std::invalid_argument("query " + std::to_string(i) + ": step " + std::to_string(r) +
                                      " chose item " + std::to_string(it) +
                                      " twice (each item is scored once per query)");
      }
    }
    clock.mark(kCheck);
    new_scores.assign(items.size(), std::numeric_limits<float>::quiet_NaN());
    std::vector<ScoreRequest> reqs;
    reqs.reserve(static_cast<size_t>(Q));
    for (int64_t i = 0; i < Q; ++i)
      if (offs[i + 1] > offs[i])
        reqs.push_back(ScoreRequest{i, items.data() + offs[i], offs[i + 1] - offs[i],
                                    new_scores.data() + offs[i]});
    if (!reqs.empty()) scorer.score_batch(reqs.data(), static_cast<int64_t>(reqs.size()));
    clock.mark(kScore);
    for (int64_t i = 0; i < Q; ++i) {
      const int64_t b = offs[i], m = offs[i + 1] - offs[i];
      for (int64_t t = b; t < b + m; ++t)
        if (!std::isfinite(new_scores[t]))
          throw std::invalid_argument("the scorer returned a NaN/inf score (or none) for query " +
                                      std::to_string(i) + ", item " + std::to_string(items[t]));
      SearchResult& R = res[i];
      R.scored_items.insert(R.scored_items.end(), items.begin() + b, items.begin() + b + m);
      R.scored_scores.insert(R.scored_scores.end(), new_scores.begin() + b,
                             new_scores.begin() + b + m);
      R.calls += m;
      if (stop_on && m > 0 && static_cast<int64_t>(pred[i].size()) == m) {
        for (int64_t t = 0; t < m; ++t)
          errs[i].push_back(static_cast<double>(new_scores[b + t]) - pred[i][t]);
        pred[i].clear();
      }
      if (rounds && r < last_solve && !small[i] && m > 0) {
        targets.resize(static_cast<size_t>(m));
        for (int64_t t = 0; t < m; ++t)
          targets[t] = (static_cast<double>(new_scores[b + t]) - o.score_beta) / o.score_alpha;
        if (o.solve == Solve::LeastSquares)
          states[i].append(items.data() + b, targets.data(), m);
        else if (o.solve == Solve::PriorRidge)
          ridges[i].append(items.data() + b, targets.data(), m);
        else
          targets_of[i].insert(targets_of[i].end(), targets.begin(), targets.end());
      }
    }
    clock.mark(kAppend);
  }

  // final ranking: exact score descending, ties to the lower id
  for (int64_t i = 0; i < Q; ++i) {
    SearchResult& R = res[i];
    std::vector<int64_t> order;
    order.reserve(R.scored_items.size());
    for (size_t t = 0; t < R.scored_items.size(); ++t)
      if (!use_ranked[i] || ranked[i].count(R.scored_items[t]))
        order.push_back(static_cast<int64_t>(t));
    const int64_t kk = std::min<int64_t>(o.k, static_cast<int64_t>(order.size()));
    std::partial_sort(order.begin(), order.begin() + kk, order.end(), [&](int64_t a, int64_t b) {
      const float sa = R.scored_scores[a], sb = R.scored_scores[b];
      return sa > sb || (sa == sb && R.scored_items[a] < R.scored_items[b]);
    });
    R.ids.assign(static_cast<size_t>(o.k), -1);
    R.scores.assign(static_cast<size_t>(o.k), -std::numeric_limits<float>::infinity());
    for (int64_t t = 0; t < kk; ++t) {
      R.ids[t] = R.scored_items[order[t]];
      R.scores[t] = R.scored_scores[order[t]];
    }
  }
  clock.mark(kFinal);
  return res;
}

SearchResult search_one(const Features& features, Scorer& scorer, const std::vector<Step>& plan,
                        const SearchOptions& options, const SearchQuery& query) {
  return std::move(search(features, scorer, plan, options, {query})[0]);
}

}  // namespace crossknn
