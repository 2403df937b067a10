#pragma once
// crossknn/least_squares.h: one query's incremental least-squares state over rows of a Features
// matrix: u = argmin ||V[A] u - a||, with A the items scored so far and a their (exact) scores.
//
// Math. Regime |A| < d: Cholesky factor of V[A] V[A]^T + delta I; regime |A| >= d: Cholesky
// factor of V[A]^T V[A] + delta I; both extended block-wise as rows arrive (accumulated in
// double; no pinv or SVD per call). ridge > 0: delta = ridge and solve() returns
// (X^T X + ridge I)^-1 X^T a exactly. ridge = 0: delta = jitter_rel * max_i ||x_i||^2 (1e-10 by
// default) and `refine` steps of iterated Tikhonov refinement bring the result to the min-norm
// least-squares (pinv) solution (error factor (delta / (sigma^2 + delta))^(refine+1) per singular
// direction); directions with sigma^2 well below delta (numerical rank deficiency) are dropped,
// as pinv with rcond would. Never NaN.
//
// Ownership. The state holds a handle to the Features (shared storage), so the matrix lives at
// least as long as the state; for a view, the viewed memory must too.
//
// Threads. Every call takes the state's internal lock, so calls on one object from several
// threads are safe (serialized); distinct objects are independent. Errors are std exceptions
// (invalid_argument, out_of_range), thrown before the state changes.

#include <cstdint>
#include <memory>
#include <vector>

#include "crossknn/features.h"

namespace crossknn {

class LeastSquares {
 public:
  explicit LeastSquares(const Features& features, double ridge = 0.0, int refine = 3,
                        double jitter_rel = 1e-10);
  ~LeastSquares();
  LeastSquares(LeastSquares&&) noexcept;
  LeastSquares& operator=(LeastSquares&&) noexcept;
  LeastSquares(const LeastSquares&) = delete;
  LeastSquares& operator=(const LeastSquares&) = delete;

  // Items must be new (not yet in the state, no repeats in the call), in [0, N); targets finite.
  void append(const int64_t* items, const double* targets, int64_t m);
  // u (d doubles). With a prior set, u = (1 - mix) u_ls + mix prior. Empty state: u = 0 (mixed).
  void solve(double* u) const;
  // solve() and, in the dual regime (0 < |A| < d) without a prior, u's coefficients over the
  // scored rows in items() order: u = sum_t coef[t] V[items()[t]] + e, ||e|| <= *err (the
  // rounding of solve's sums). coef holds size() doubles. false (coef, err not written) in the
  // other cases; u is solve()'s, bit for bit, either way.
  bool solve_dual(double* u, double* coef, double* err) const;
  void set_prior(const double* prior, double mix);  // prior == nullptr clears it
  void clear_prior();

  int64_t size() const noexcept;
  int64_t dim() const noexcept;
  double ridge() const noexcept;
  bool primal() const noexcept;        // true once |A| >= d
  std::vector<int64_t> items() const;  // copies, in append order
  std::vector<double> targets() const;
  double delta() const noexcept;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace crossknn
