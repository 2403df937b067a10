// Incremental least squares for one query's scored set A (see least_squares.h for the math).
#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <utility>

#include "crossknn/least_squares.h"
#include "dots.h"
#include "features_impl.h"
#include "gram.h"
#include "kernels.h"

namespace crossknn {

namespace {

// Hot loops of the solver, compiled for AVX2 and for the baseline; the loader picks one per
// process (GCC target_clones), so results stay the same from call to call.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CROSSKNN_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CROSSKNN_CLONES
#endif

CROSSKNN_CLONES double dot(const double* a, const double* b, int64_t n) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) s[l] += a[j + l] * b[j + l];
  for (; j < n; ++j) s[0] += a[j] * b[j];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

CROSSKNN_CLONES void axpy(double alpha, const double* x, double* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] += alpha * x[j];
}

// The same operations on the scored rows kept as float32 (their values are floats: converting
// to double is exact, so these give the bits of dot / axpy on the rows as doubles).
CROSSKNN_CLONES double dot(const float* a, const double* b, int64_t n) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) s[l] += static_cast<double>(a[j + l]) * b[j + l];
  for (; j < n; ++j) s[0] += static_cast<double>(a[j]) * b[j];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

CROSSKNN_CLONES double dot(const float* a, const float* b, int64_t n) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l)
      s[l] += static_cast<double>(a[j + l]) * static_cast<double>(b[j + l]);
  for (; j < n; ++j) s[0] += static_cast<double>(a[j]) * static_cast<double>(b[j]);
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

CROSSKNN_CLONES void axpy(double alpha, const float* x, double* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] += alpha * static_cast<double>(x[j]);
}

// one Givens step of a rank-1 Cholesky update on row k of R (entries j > k)
CROSSKNN_CLONES void givens_row(double* rk, double* x, int64_t n, double c, double s) {
  const double ic = 1.0 / c;
  for (int64_t j = 0; j < n; ++j) {
    const double rj = (rk[j] + s * x[j]) * ic;
    rk[j] = rj;
    x[j] = c * x[j] - s * rj;
  }
}

}  // namespace

// The private state of a LeastSquares (kept out of the public header with its lock).
struct LeastSquares::State {
  State(const Features& features, double ridge, int refine, double jitter_rel);
  void append(const int64_t* items, const double* targets, int64_t m);
  bool solve(double* u, double* coef, double* err) const;
  void set_prior(const double* prior, double mix);
  std::vector<int64_t> items() const;
  std::vector<double> targets() const;
  void refactor_();
  void extend_dual_(int64_t m0);
  void extend_primal_(int64_t m0);
  void apply_inv_(double* v) const;  // v <- (F + delta I)^-1 v using the current factor

  Features f_;  // shares the matrix: it lives as long as this state
  int64_t d_;
  double ridge_, jitter_rel_;
  int refine_;
  int64_t m_ = 0;
  std::vector<int64_t> items_;
  std::unordered_set<int64_t> seen_;
  // m x d scored rows as float32 (every storage's rows are float values, so this is exact and
  // half the bytes of doubles); grown geometrically
  std::vector<float> Xf_;
  std::vector<double> rowbuf_;  // Features::rows output of one append
  std::vector<double> a_;
  std::vector<double> norm2_;  // x . x of each scored row (dot(): the bits extend_dual_ uses)
  bool primal_ = false;
  double delta_ = 0.0, scale_ = 0.0;  // scale_: max row norm^2 delta was derived from
  // dual: L lower-triangular m x m, row-major with stride cap_ (grown by doubling; entries
  // right of the diagonal are never written or read)
  // primal: R upper-triangular d x d, row-major (R^T R = X^T X + delta I)
  std::unique_ptr<double[]> L_;
  int64_t cap_ = 0;
  std::vector<double> R_;
  std::vector<double> prior_;
  double mix_ = 0.0;
  mutable std::mutex mu_;
};

LeastSquares::State::State(const Features& features, double ridge, int refine, double jitter_rel)
    : f_(features), d_(features.dim()), ridge_(ridge), jitter_rel_(jitter_rel), refine_(refine) {
  if (!(ridge >= 0.0) || !std::isfinite(ridge))
    throw std::invalid_argument("ridge must be a finite number >= 0; got " + std::to_string(ridge));
  if (refine < 0 || refine > 100)
    throw std::invalid_argument("refine must be in [0, 100]; got " + std::to_string(refine));
  if (!(jitter_rel > 0.0) || !(jitter_rel < 1.0))
    throw std::invalid_argument("jitter_rel must be in (0, 1); got " + std::to_string(jitter_rel));
  if (ridge_ > 0) delta_ = ridge_;
}

std::vector<int64_t> LeastSquares::State::items() const {
  std::lock_guard<std::mutex> lock(mu_);
  return items_;
}

std::vector<double> LeastSquares::State::targets() const {
  std::lock_guard<std::mutex> lock(mu_);
  return a_;
}

void LeastSquares::State::append(const int64_t* items, const double* targets, int64_t m) {
  std::lock_guard<std::mutex> lock(mu_);
  if (m < 0) throw std::invalid_argument("number of rows must be >= 0");
  if (m == 0) return;
  const int64_t n = f_.n_items();
  std::unordered_set<int64_t> fresh;
  for (int64_t t = 0; t < m; ++t) {
    const int64_t i = items[t];
    if (i < 0 || i >= n)
      throw std::out_of_range("item id " + std::to_string(i) + " is outside [0, " +
                              std::to_string(n) + ")");
    if (seen_.count(i) || !fresh.insert(i).second)
      throw std::invalid_argument("item " + std::to_string(i) +
                                  " was appended twice (each item is scored once per query)");
    if (!std::isfinite(targets[t]))
      throw std::invalid_argument("targets contain NaN or inf (position " + std::to_string(t) +
                                  ")");
  }
  const int64_t m0 = m_;
  rowbuf_.resize(static_cast<size_t>(m * d_));
  f_.rows(items, m, rowbuf_.data());
  const size_t need = static_cast<size_t>((m0 + m) * d_);
  if (Xf_.capacity() < need) Xf_.reserve(std::max(need, 2 * Xf_.capacity()));
  Xf_.resize(need);
  for (int64_t t = 0; t < m * d_; ++t) Xf_[m0 * d_ + t] = static_cast<float>(rowbuf_[t]);
  items_.insert(items_.end(), items, items + m);
  a_.insert(a_.end(), targets, targets + m);
  seen_.insert(fresh.begin(), fresh.end());
  m_ = m0 + m;
  for (int64_t t = m0; t < m_; ++t) {
    const float* x = Xf_.data() + t * d_;
    norm2_.push_back(dot(x, x, d_));
  }

  bool rebuild = false;
  if (ridge_ == 0.0) {
    double mx = 0.0;
    for (int64_t t = m0; t < m_; ++t) mx = std::max(mx, norm2_[t]);
    // delta follows the scale of the rows; a jump of more than 100x refactors with the new one
    if (mx > 0.0 && (scale_ == 0.0 || mx > 100.0 * scale_)) {
      scale_ = mx;
      delta_ = jitter_rel_ * scale_;
      rebuild = m0 > 0;
    }
    if (scale_ == 0.0) delta_ = 1.0;  // only zero rows so far: u = 0 whatever delta is
  }
  if (rebuild || (!primal_ && m_ >= d_)) {
    refactor_();
  } else if (!primal_) {
    extend_dual_(m0);
  } else {
    extend_primal_(m0);
  }
}

void LeastSquares::State::refactor_() {
  if (m_ < d_) {
    primal_ = false;
    R_.clear();
    extend_dual_(0);
    return;
  }
  primal_ = true;
  L_.reset();
  cap_ = 0;
  // G = X^T X + delta I (upper triangle), then right-looking Cholesky G = R^T R in place
  const int64_t d = d_;
  R_.assign(static_cast<size_t>(d * d), 0.0);
  // G_ij = sum over t in order of x_ti x_tj (j >= i): tiles of four rows held in registers
  // while t runs (detail::gram_tiles), the rows left over as before. Skipping x_ti = 0 (the
  // loop below) and adding its +-0 products (the tiles) give the same bits: the sums start at
  // +0 and an exact cancellation rounds to +0, so no sum is ever -0.
  const double work = static_cast<double>(m_) * static_cast<double>(d) * d / 2;
  const std::vector<double> X(Xf_.begin(), Xf_.end());  // the rows as doubles, once
  const int64_t tiled =
      detail::gram_tiles(X.data(), m_, d, R_.data(), work < 1e7 ? 1 : f_.threads());
  for (int64_t t = 0; t < m_; ++t) {
    const double* x = X.data() + t * d;
    for (int64_t i = tiled; i < d; ++i)
      if (x[i] != 0.0) axpy(x[i], x + i, R_.data() + i * d + i, d - i);
  }
  for (int64_t i = 0; i < d; ++i) R_[i * d + i] += delta_;
  // Right-looking order per entry, four rows at a time: a block of rows first takes the updates
  // of every finished row k < i0 (in k order; tiles in registers, detail::chol_block_update),
  // then its own rows go right-looking. Each entry gets the same updates in the same order as
  // when every finished row updated all rows below it at once.
  for (int64_t i0 = 0; i0 < d; i0 += 4) {
    const int64_t i1 = std::min(d, i0 + 4);
    if (!detail::chol_block_update(R_.data(), d, i0, R_.data())) {
      for (int64_t k = 0; k < i0; ++k) {
        const double* rk = R_.data() + k * d;
        for (int64_t i = i0; i < i1; ++i)
          if (rk[i] != 0.0) axpy(-rk[i], rk + i, R_.data() + i * d + i, d - i);
      }
    }
    for (int64_t k = i0; k < i1; ++k) {
      double* rk = R_.data() + k * d;
      const double p = std::max(rk[k], delta_);  // >= delta in exact arithmetic
      const double r = std::sqrt(p);
      rk[k] = r;
      for (int64_t j = k + 1; j < d; ++j) rk[j] /= r;
      for (int64_t i = k + 1; i < i1; ++i)
        if (rk[i] != 0.0) axpy(-rk[i], rk + i, R_.data() + i * d + i, d - i);
    }
  }
  for (int64_t i = 1; i < d; ++i) std::fill(R_.begin() + i * d, R_.begin() + i * d + i, 0.0);
}

void LeastSquares::State::extend_dual_(int64_t m0) {
  if (m_ > cap_) {
    int64_t cap = std::max<int64_t>(16, cap_);
    while (cap < m_) cap *= 2;
    cap = std::min(cap, std::max<int64_t>(d_, m_));
    std::unique_ptr<double[]> L(new double[static_cast<size_t>(cap * cap)]);
    for (int64_t i = 0; i < m0; ++i)
      std::copy(L_.get() + i * cap_, L_.get() + i * cap_ + i + 1, L.get() + i * cap);
    L_.swap(L);
    cap_ = cap;
  }
  // rows i >= m0 of L with L L^T = X X^T + delta I: l_i = L[:i,:i]^-1 (X[:i] x_i).
  // First the Gram entries x_j . x_i (j < i) of every new row, blocks of 16 rows on threads
  // (detail::gram_rows_f: register tiles, L1-sized column chunks); then groups of four new rows,
  // on threads: the part of the triangular solve over the old rows (j < m0) depends on no other
  // new row; then the rest in row order. Every entry gets the operations of one dot() at a time.
  const int64_t nn = m_ - m0, n_groups = (nn + 3) / 4;
  const detail::ItemGram* G = f_.gram() ? detail::ready_gram(detail::data(f_)) : nullptr;
  const double work = static_cast<double>(nn) * static_cast<double>(m_) * (G ? m0 : d_ + m0);
  const int T = work < 3e7 ? 1 : f_.threads();  // threads only for long appends
  if (G) {  // the item Gram cache holds these entries, the same bits (gram.h)
    const int64_t n = f_.n_items();
    for (int64_t i = m0; i < m_; ++i) {
      const double* gi = G->g.data() + items_[i] * n;
      double* li = L_.get() + i * cap_;
      for (int64_t j = 0; j < i; ++j) li[j] = gi[items_[j]];
    }
  } else {
    detail::parallel_for(T, (nn + 15) / 16, [&](int, int64_t g) {
      const int64_t g0 = m0 + 16 * g, g1 = std::min(m_, g0 + 16);
      detail::gram_rows_f(detail::DotOrder::Interleaved, Xf_.data(), d_, d_, g0, g1, g1 - 1,
                          L_.get() + g0 * cap_, cap_);
    });
  }
  if (m0 > 0)
    detail::parallel_for(T, n_groups, [&](int, int64_t g) {
      const int64_t g0 = m0 + 4 * g, g1 = std::min(m_, g0 + 4);
      const int na = static_cast<int>(g1 - g0);
      const double* lc[4];
      double* ls[4];
      double out[4];
      for (int t = 0; t < na; ++t) lc[t] = ls[t] = L_.get() + (g0 + t) * cap_;
      for (int64_t j = 0; j < m0; ++j) {
        const double* lj = L_.get() + j * cap_;
        detail::dots(detail::DotOrder::Interleaved, lc, na, lj, j, out);
        for (int t = 0; t < na; ++t) ls[t][j] = (ls[t][j] - out[t]) / lj[j];
      }
    });
  for (int64_t i = m0; i < m_; ++i) {
    const float* xi = Xf_.data() + i * d_;
    double* li = L_.get() + i * cap_;
    for (int64_t j = m0; j < i; ++j) {
      const double* lj = L_.get() + j * cap_;
      li[j] = (li[j] - dot(lj, li, j)) / lj[j];
    }
    const double p = norm2_[i] + delta_ - dot(li, li, i);
    li[i] = std::sqrt(std::max(p, delta_));  // Schur complement >= delta in exact arithmetic
  }
}

void LeastSquares::State::extend_primal_(int64_t m0) {
  // rank-1 updates R^T R + x x^T for each new row (Givens-style, as LINPACK dchud)
  const int64_t d = d_;
  std::vector<double> x(static_cast<size_t>(d));
  for (int64_t t = m0; t < m_; ++t) {
    std::copy(Xf_.begin() + t * d, Xf_.begin() + (t + 1) * d, x.begin());
    for (int64_t k = 0; k < d; ++k) {
      if (x[k] == 0.0) continue;
      double* rk = R_.data() + k * d;
      const double r = std::hypot(rk[k], x[k]);
      const double c = r / rk[k], s = x[k] / rk[k];
      rk[k] = r;
      givens_row(rk + k + 1, x.data() + k + 1, d - k - 1, c, s);
    }
  }
}

void LeastSquares::State::apply_inv_(double* v) const {
  if (primal_) {  // R^T y = v, then R z = y
    const int64_t d = d_;
    for (int64_t i = 0; i < d; ++i) {
      v[i] /= R_[i * d + i];
      const double vi = v[i];
      if (vi != 0.0) axpy(-vi, R_.data() + i * d + i + 1, v + i + 1, d - i - 1);
    }
    for (int64_t i = d - 1; i >= 0; --i) {
      const double* ri = R_.data() + i * d;
      v[i] = (v[i] - dot(ri + i + 1, v + i + 1, d - i - 1)) / ri[i];
    }
  } else {  // L y = v, then L^T z = y
    const int64_t m = m_;
    for (int64_t i = 0; i < m; ++i) {
      const double* li = L_.get() + i * cap_;
      v[i] = (v[i] - dot(li, v, i)) / li[i];
    }
    for (int64_t i = m - 1; i >= 0; --i) {
      const double* li = L_.get() + i * cap_;
      v[i] /= li[i];
      const double vi = v[i];
      if (vi != 0.0) axpy(-vi, li, v, i);
    }
  }
}

bool LeastSquares::State::solve(double* u, double* coef, double* err) const {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t d = d_, m = m_;
  const bool dual = coef && m > 0 && !primal_ && prior_.empty();
  std::fill(u, u + d, 0.0);
  std::vector<double> W;  // sum over steps of |w_t|: the rounding bound of u's sums
  if (dual) {
    std::fill(coef, coef + m, 0.0);
    W.assign(static_cast<size_t>(m), 0.0);
  }
  const int steps = ridge_ > 0.0 ? 1 : 1 + refine_;
  if (m > 0) {
    std::vector<double> r(a_), w(static_cast<size_t>(primal_ ? d : m));
    for (int step = 0; step < steps; ++step) {
      if (step > 0)  // residual r = a - X u
        for (int64_t t = 0; t < m; ++t) r[t] = a_[t] - dot(Xf_.data() + t * d, u, d);
      if (primal_) {  // du = (X^T X + delta I)^-1 X^T r
        std::fill(w.begin(), w.end(), 0.0);
        for (int64_t t = 0; t < m; ++t) axpy(r[t], Xf_.data() + t * d, w.data(), d);
        apply_inv_(w.data());
        for (int64_t j = 0; j < d; ++j) u[j] += w[j];
      } else {  // du = X^T (X X^T + delta I)^-1 r
        std::copy(r.begin(), r.end(), w.begin());
        apply_inv_(w.data());
        for (int64_t t = 0; t < m; ++t) axpy(w[t], Xf_.data() + t * d, u, d);
        if (dual)
          for (int64_t t = 0; t < m; ++t) {
            coef[t] += w[t];
            W[t] += std::fabs(w[t]);
          }
      }
    }
  }
  if (!prior_.empty())
    for (int64_t j = 0; j < d; ++j) u[j] = (1.0 - mix_) * u[j] + mix_ * prior_[j];
  if (!dual) return false;
  // each u_j sums steps * m products (axpy, in order), each coef_t steps values: |u - sum_t
  // coef_t x_t| <= (gamma(steps m + 1) + gamma(steps)) sum_t W_t |x_t| entrywise
  const double eps = std::ldexp(1.0, -53);
  auto gamma = [&](double terms) { return terms * eps / (1.0 - terms * eps); };
  double s = 0.0;
  for (int64_t t = 0; t < m; ++t) s += W[t] * std::sqrt(norm2_[t]) * (1.0 + 1e-9);
  *err = (gamma(static_cast<double>(steps) * m + 1) + gamma(steps)) * s * 1.01;
  return true;
}

void LeastSquares::State::set_prior(const double* prior, double mix) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!prior) {
    prior_.clear();
    mix_ = 0.0;
    return;
  }
  if (!(mix >= 0.0 && mix <= 1.0))
    throw std::invalid_argument("mix must be in [0, 1]; got " + std::to_string(mix));
  for (int64_t j = 0; j < d_; ++j)
    if (!std::isfinite(prior[j]))
      throw std::invalid_argument("prior contains NaN or inf (position " + std::to_string(j) + ")");
  prior_.assign(prior, prior + d_);
  mix_ = mix;
}

LeastSquares::LeastSquares(const Features& features, double ridge, int refine, double jitter_rel)
    : s_(std::make_unique<State>(features, ridge, refine, jitter_rel)) {}
LeastSquares::~LeastSquares() = default;
LeastSquares::LeastSquares(LeastSquares&&) noexcept = default;
LeastSquares& LeastSquares::operator=(LeastSquares&&) noexcept = default;

void LeastSquares::append(const int64_t* items, const double* targets, int64_t m) {
  s_->append(items, targets, m);
}
void LeastSquares::solve(double* u) const { s_->solve(u, nullptr, nullptr); }
bool LeastSquares::solve_dual(double* u, double* coef, double* err) const {
  return s_->solve(u, coef, err);
}
void LeastSquares::set_prior(const double* prior, double mix) { s_->set_prior(prior, mix); }
void LeastSquares::clear_prior() { s_->set_prior(nullptr, 0.0); }
std::vector<int64_t> LeastSquares::items() const { return s_->items(); }
std::vector<double> LeastSquares::targets() const { return s_->targets(); }

// scalar accessors: values fixed at construction (d, ridge) or read under the lock
int64_t LeastSquares::dim() const noexcept { return s_->d_; }
double LeastSquares::ridge() const noexcept { return s_->ridge_; }
int64_t LeastSquares::size() const noexcept {
  std::lock_guard<std::mutex> lock(s_->mu_);
  return s_->m_;
}
bool LeastSquares::primal() const noexcept {
  std::lock_guard<std::mutex> lock(s_->mu_);
  return s_->primal_;
}
double LeastSquares::delta() const noexcept {
  std::lock_guard<std::mutex> lock(s_->mu_);
  return s_->delta_;
}

}  // namespace crossknn
