// auto's features and prior (crossknn/auto_index.h): plain loops in double, index order.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "crossknn/auto_index.h"
#include "crossknn/prior.h"

namespace crossknn {

std::vector<float> auto_features(const float* V, int64_t n, int64_t d, const float* R, int64_t m,
                                 const float* A, int64_t r) {
  if (n < 1 || d < 1 || m < 0 || r < 0 || (m > 0 && !R) || (r > 0 && !A))
    throw std::invalid_argument("auto_features needs n, d >= 1 and the rows / directions given");
  const int64_t F = d + m + r + 1;
  std::vector<float> X(static_cast<size_t>(n * F));
  for (int64_t i = 0; i < n; ++i) {
    std::copy(V + i * d, V + (i + 1) * d, X.begin() + i * F);
    X[static_cast<size_t>(i * F + F - 1)] = 1.0f;
  }
  for (int64_t j = 0; j < m; ++j) {  // zrows: centred, unit standard deviation
    const float* row = R + j * n;
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(row[i]);
    const double mean = sum / static_cast<double>(n);
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double c = static_cast<double>(row[i]) - mean;
      ss += c * c;
    }
    const double sd = std::sqrt(ss / static_cast<double>(n));
    const double div = sd > 0.0 ? sd : 1.0;
    for (int64_t i = 0; i < n; ++i)
      X[static_cast<size_t>(i * F + d + j)] =
          static_cast<float>((static_cast<double>(row[i]) - mean) / div);
  }
  if (r > 0) {  // V A: each entry sums over k in order
    std::vector<double> Ad(A, A + d * r), acc(static_cast<size_t>(r));
    for (int64_t i = 0; i < n; ++i) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t k = 0; k < d; ++k) {
        const double v = static_cast<double>(V[i * d + k]);
        const double* a = Ad.data() + k * r;
        for (int64_t c = 0; c < r; ++c) acc[c] += v * a[c];
      }
      for (int64_t c = 0; c < r; ++c)
        X[static_cast<size_t>(i * F + d + m + c)] = static_cast<float>(acc[c]);
    }
  }
  return X;
}

std::vector<double> item_covariance(const float* V, int64_t n, int64_t d) {
  std::vector<double> mean(static_cast<size_t>(d), 0.0), C(static_cast<size_t>(d * d), 0.0),
      x(static_cast<size_t>(d));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < d; ++k) mean[k] += static_cast<double>(V[i * d + k]);
  const double nn = static_cast<double>(std::max<int64_t>(n, 1));
  for (auto& v : mean) v /= nn;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < d; ++k) x[k] = static_cast<double>(V[i * d + k]) - mean[k];
    for (int64_t a = 0; a < d; ++a) {
      const double xa = x[a];
      double* c = C.data() + a * d;
      for (int64_t b = 0; b < d; ++b) c[b] += xa * x[b];
    }
  }
  for (auto& v : C) v /= nn;
  return C;
}

bool packed_cholesky(const double* C, int64_t d, std::vector<double>& out) {
  std::vector<double> L(static_cast<size_t>(d * d), 0.0);
  for (int64_t j = 0; j < d; ++j) {
    double s = C[j * d + j];
    for (int64_t k = 0; k < j; ++k) s -= L[j * d + k] * L[j * d + k];
    if (!(s > 0.0) || !std::isfinite(s)) return false;
    const double ljj = std::sqrt(s);
    L[j * d + j] = ljj;
    for (int64_t i = j + 1; i < d; ++i) {
      double t = C[i * d + j];
      const double* li = L.data() + i * d;
      const double* lj = L.data() + j * d;
      for (int64_t k = 0; k < j; ++k) t -= li[k] * lj[k];
      L[i * d + j] = t / ljj;
      if (!std::isfinite(L[i * d + j])) return false;
    }
  }
  out.clear();
  out.reserve(static_cast<size_t>(d * (d + 1) / 2));
  for (int64_t j = 0; j < d; ++j)
    for (int64_t i = j; i < d; ++i) out.push_back(L[i * d + j]);
  return true;
}

namespace {

// X = A^-1 B for A (n x n) and B (n x k), Gaussian elimination with partial pivoting
std::vector<double> solve(std::vector<double> A, std::vector<double> B, int64_t n, int64_t k) {
  for (int64_t c = 0; c < n; ++c) {
    int64_t p = c;
    for (int64_t i = c + 1; i < n; ++i)
      if (std::fabs(A[i * n + c]) > std::fabs(A[p * n + c])) p = i;
    if (!(std::fabs(A[p * n + c]) > 0.0))
      throw std::invalid_argument("auto's learned prior: its kernel matrix is singular");
    if (p != c) {
      for (int64_t j = 0; j < n; ++j) std::swap(A[c * n + j], A[p * n + j]);
      for (int64_t j = 0; j < k; ++j) std::swap(B[c * k + j], B[p * k + j]);
    }
    for (int64_t i = c + 1; i < n; ++i) {
      const double f = A[i * n + c] / A[c * n + c];
      if (f == 0.0) continue;
      for (int64_t j = c; j < n; ++j) A[i * n + j] -= f * A[c * n + j];
      for (int64_t j = 0; j < k; ++j) B[i * k + j] -= f * B[c * k + j];
    }
  }
  for (int64_t c = n - 1; c >= 0; --c) {
    for (int64_t j = 0; j < k; ++j) {
      double t = B[c * k + j];
      for (int64_t i = c + 1; i < n; ++i) t -= A[c * n + i] * B[i * k + j];
      B[c * k + j] = t / A[c * n + c];
    }
  }
  return B;
}

}  // namespace

AutoPrior::AutoPrior(const AutoPriorSpec& s)
    : d_(s.d),
      m_(s.m),
      r_(s.r),
      P_(s.P),
      alpha_(s.alpha),
      tau_(s.tau),
      ridge_(s.ridge),
      kernel_tau_(s.kernel_tau) {
  if (d_ < 1 || m_ < 0 || r_ < 0 || P_ < 0)
    throw std::invalid_argument("AutoPrior needs d >= 1 and m, r, P >= 0");
  if (!(alpha_ >= 0.0) || !(tau_ > 0.0) || !(ridge_ >= 0.0) || !(kernel_tau_ > 0.0))
    throw std::invalid_argument("AutoPrior needs alpha >= 0, tau > 0, ridge >= 0, kernel_tau > 0");
  learned_ = s.deltas != nullptr;
  if (learned_ && P_ < 1) throw std::invalid_argument("a learned prior needs P >= 1 queries");
  tables_ = learned_ || (alpha_ > 0.0 && m_ > 0);
  if (!tables_) return;
  if (!learned_ && P_ != m_)
    throw std::invalid_argument("the row prior needs one DE vector per row: " +
                                std::to_string(m_) + " rows, " + std::to_string(P_) + " vectors");
  if (P_ > 0 && !s.W) throw std::invalid_argument("AutoPrior: the prior's query vectors are missing");
  W_.assign(s.W, s.W + P_ * d_);
  wn_.resize(static_cast<size_t>(P_));
  for (int64_t j = 0; j < P_; ++j) {
    double t = 0.0;
    for (int64_t k = 0; k < d_; ++k) {
      const double w = static_cast<double>(W_[j * d_ + k]);
      t += w * w;
    }
    wn_[j] = std::max(std::sqrt(t), 1e-12);
  }
  if (s.cov) {
    cov_.assign(s.cov, s.cov + d_ * d_);
  } else {
    if (!s.V || s.n < 1)
      throw std::invalid_argument("AutoPrior needs the items' covariance or the item vectors");
    cov_ = item_covariance(s.V, s.n, d_);
  }
  if (s.chol)
    chol_.assign(s.chol, s.chol + d_ * (d_ + 1) / 2);
  else if (!packed_cholesky(cov_.data(), d_, chol_))
    chol_.clear();
  if (!learned_) return;
  const int64_t F = width();
  deltas_.resize(static_cast<size_t>(P_ * F));
  for (int64_t t = 0; t < P_ * F; ++t) deltas_[t] = static_cast<double>(s.deltas[t]);
  if (ridge_ > 0.0) {  // the kernel ridge: mean correction and dual coefficients
    mu_.assign(static_cast<size_t>(F), 0.0);
    for (int64_t j = 0; j < P_; ++j)
      for (int64_t c = 0; c < F; ++c) mu_[c] += deltas_[j * F + c];
    for (auto& x : mu_) x /= static_cast<double>(P_);
    std::vector<double> K(static_cast<size_t>(P_ * P_)), B(static_cast<size_t>(P_ * F));
    for (int64_t a = 0; a < P_; ++a)
      for (int64_t b = 0; b < P_; ++b) {
        double t = 0.0;
        for (int64_t k = 0; k < d_; ++k)
          t += (static_cast<double>(W_[a * d_ + k]) / wn_[a]) *
               (static_cast<double>(W_[b * d_ + k]) / wn_[b]);
        K[a * P_ + b] = std::exp(kernel_tau_ * (t - 1.0)) + (a == b ? ridge_ : 0.0);
      }
    for (int64_t j = 0; j < P_; ++j)
      for (int64_t c = 0; c < F; ++c) B[j * F + c] = deltas_[j * F + c] - mu_[c];
    dual_ = solve(std::move(K), std::move(B), P_, F);
  }
}

void AutoPrior::cosines(const double* v, double* out) const {
  double t = 0.0;
  for (int64_t k = 0; k < d_; ++k) t += v[k] * v[k];
  const double nv = std::max(std::sqrt(t), 1e-12);
  rows_dot(W_.data(), P_, d_, v, out);
  for (int64_t j = 0; j < P_; ++j) out[j] = out[j] / (wn_[j] * nv);
}

double AutoPrior::spread(const double* v) const {
  if (!chol_.empty()) return std::sqrt(packed_lower_t_norm2(chol_.data(), d_, v));
  double t = 0.0;
  for (int64_t a = 0; a < d_; ++a) {
    double ca = 0.0;
    for (int64_t b = 0; b < d_; ++b) ca += cov_[a * d_ + b] * v[b];
    t += v[a] * ca;
  }
  return std::sqrt(std::max(t, 0.0));
}

void AutoPrior::prior(const double* v, double* p) const {
  const int64_t F = width();
  std::fill(p, p + F, 0.0);
  if (!learned_) {
    std::copy(v, v + d_, p);
    if (!tables_) return;
    std::vector<double> cos(static_cast<size_t>(P_));
    cosines(v, cos.data());
    const double top = *std::max_element(cos.begin(), cos.end());
    double sum = 0.0;
    for (auto& c : cos) {
      c = std::exp(tau_ * (c - top));
      sum += c;
    }
    const double scale = alpha_ * spread(v);
    for (int64_t j = 0; j < m_; ++j) p[d_ + j] = scale * cos[j] / sum;
    return;
  }
  std::vector<double> cos(static_cast<size_t>(P_));
  cosines(v, cos.data());
  const double spr = spread(v);
  if (ridge_ > 0.0) {  // spread * (mu + k(v)^T dual)
    for (auto& c : cos) c = std::exp(kernel_tau_ * (c - 1.0));
    for (int64_t c = 0; c < F; ++c) {
      double t = 0.0;
      for (int64_t j = 0; j < P_; ++j) t += cos[j] * dual_[j * F + c];
      p[c] = spr * (mu_[c] + t);
    }
  } else {  // (spread / sum w) * (w^T deltas), w = softmax weights
    const double top = *std::max_element(cos.begin(), cos.end());
    double sum = 0.0;
    for (auto& c : cos) {
      c = std::exp(tau_ * (c - top));
      sum += c;
    }
    const double scale = spr / sum;
    for (int64_t c = 0; c < F; ++c) {
      double t = 0.0;
      for (int64_t j = 0; j < P_; ++j) t += cos[j] * deltas_[j * F + c];
      p[c] = scale * t;
    }
  }
  for (int64_t k = 0; k < d_; ++k) p[k] += v[k];
}

}  // namespace crossknn
