#pragma once
// crossknn/auto_index.h: the arithmetic of method `auto` around the round loop, the one copy
// that Python's crossknn.search.auto.AutoIndex and the C++ crossknn::Searcher both run (so the
// two give the same bits): the item features X = [V | zrows(R)^T | V A | 1], the items'
// covariance and its Cholesky factor, and a query's prior p0 (the DE query vector plus the row
// prior or the learned prior; crossknn/search.h Solve::PriorRidge pulls the ridge towards it).
//
// Every sum runs in double, in index order, on the calling thread: the same bits on every CPU.
// Threads: an AutoPrior is immutable after construction; prior() may run concurrently.
#include <cstdint>
#include <vector>

namespace crossknn {

// X (n x (d + m + r + 1), row-major float32): the DE item vectors V (n x d), the m complete CE
// rows R (m x n) each centred and scaled to unit standard deviation (a constant row: centred
// only), V A for the query directions A (d x r), and a column of ones. R / A may be null when
// m / r is 0.
std::vector<float> auto_features(const float* V, int64_t n, int64_t d, const float* R, int64_t m,
                                 const float* A, int64_t r);

// The population covariance (d x d, double) of the rows of V (n x d).
std::vector<double> item_covariance(const float* V, int64_t n, int64_t d);

// C = L L^T's factor L packed by columns (column j holds L[j:, j]: d (d + 1) / 2 values, what
// packed_lower_t_norm2 in crossknn/prior.h reads); false (out untouched) when C is not positive
// definite or the factor is not finite.
bool packed_cholesky(const double* C, int64_t d, std::vector<double>& out);

// What a query's prior reads (crossknn.search.auto.AutoIndex.prior_vector). Pointers are
// copied from, not kept.
struct AutoPriorSpec {
  int64_t d = 0;  // DE dimension
  int64_t m = 0;  // complete CE rows
  int64_t r = 0;  // query directions
  // the DE vectors (P x d) of the prior's queries: the row queries (row prior), or the fitted
  // queries when deltas is given (the learned prior); null with P = 0
  const float* W = nullptr;
  int64_t P = 0;
  const float* deltas = nullptr;  // P x (d + m + r + 1): the learned prior's corrections
  double alpha = 0.0;             // the row prior's weight (0: none)
  double tau = 10.0;              // its softmax sharpness (and the learned prior's, ridge 0)
  double ridge = 0.0;             // the learned prior's kernel ridge (0: softmax average)
  double kernel_tau = 2.0;        // its kernel exp(kernel_tau (cos - 1))
  // the items' covariance (d x d); null: computed from V (n x d) when the prior needs it
  const double* cov = nullptr;
  const float* V = nullptr;
  int64_t n = 0;
  const double* chol = nullptr;  // packed_cholesky(cov) when already known; null: computed
};

class AutoPrior {
 public:
  explicit AutoPrior(const AutoPriorSpec& spec);
  int64_t width() const noexcept { return d_ + m_ + r_ + 1; }
  int64_t dim() const noexcept { return d_; }
  // whether the prior reads the tables (a row prior with rows, or a learned prior)
  bool uses_tables() const noexcept { return tables_; }
  // p0 (width() values) for the DE query vector v (d values)
  void prior(const double* v, double* p0) const;
  // sd(V v) = sqrt(v C v) (through C's Cholesky factor where it has one)
  double spread(const double* v) const;
  // cos(v, W_j) for the prior's P queries
  void cosines(const double* v, double* out) const;
  const std::vector<double>& covariance() const noexcept { return cov_; }
  // the packed Cholesky factor (empty when C has none)
  const std::vector<double>& cholesky() const noexcept { return chol_; }

 private:
  int64_t d_, m_, r_, P_;
  bool tables_ = false, learned_ = false;
  double alpha_, tau_, ridge_, kernel_tau_;
  std::vector<float> W_;
  std::vector<double> wn_, deltas_, cov_, chol_, mu_, dual_;
};

}  // namespace crossknn
