#pragma once
// The round engine: item features V (N x d), streaming top-k / sampling over V u, and an
// incremental least-squares solver for one query's scored set.
//
// No Python here. Errors are std exceptions: std::invalid_argument for bad values/shapes,
// std::out_of_range for item ids outside [0, N), std::bad_alloc when memory runs out.
// All kernels are thread-safe on a const Features; results never depend on the thread count.

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

namespace crossknn {

enum class Storage { Float32, Float16, Int8 };

Storage parse_storage(const std::string& name);  // "float32" | "float16" | "int8"
const char* storage_name(Storage s) noexcept;
// Score kernel set in use: "avx2" or "generic" (chosen once per process; CROSSKNN_NO_SIMD=1
// in the environment forces "generic").
const char* kernel_name() noexcept;

// Exclusion lists for Q queries in CSR form: ids of query q are ids[offsets[q] .. offsets[q+1]).
// Entries equal to -1 are padding and ignored; other ids must lie in [0, N). Duplicates are fine.
struct ExcludeLists {
  const int64_t* ids = nullptr;
  const int64_t* offsets = nullptr;  // Q + 1 entries, or nullptr for "no exclusion"
};

class Features {
 public:
  // V: n x d row-major float32, copied and converted to `storage` (int8: per-row scale
  // max|v|/127, q = round-to-nearest-even(v / scale) clamped to [-127, 127]; zero rows get
  // scale 1). threads = 0 means std::thread::hardware_concurrency().
  Features(const float* V, int64_t n, int64_t d, Storage storage, int threads = 0);

  int64_t n_items() const noexcept { return n_; }
  int64_t dim() const noexcept { return d_; }
  Storage storage() const noexcept { return storage_; }
  int threads() const noexcept { return threads_; }
  void set_threads(int threads);
  // bytes of the stored matrix (what one pass of top_k reads)
  int64_t nbytes() const noexcept;

  // Dequantized rows V[items] as double, out is m x d row-major.
  void rows(const int64_t* items, int64_t m, double* out) const;

  // Q queries U (Q x d float32, row-major). Writes Q x k scores and indices, each row sorted by
  // score descending, ties to the lower index. Throws invalid_argument when k exceeds the number
  // of unmasked items of some query.
  void top_k(const float* U, int64_t Q, int64_t k, const ExcludeLists& ex, float* out_scores,
             int64_t* out_idx) const;

  // Gumbel-top-k: key_i = (V u)_i / T + G(seed, q, i), G a standard Gumbel drawn from a
  // counter-based hash of (seed, query row q, item i); the top-k keys are k draws without
  // replacement from softmax(V u / T) over unmasked items. Writes keys and indices.
  void sample_softmax(const float* U, int64_t Q, int64_t k, const ExcludeLists& ex,
                      double temperature, uint64_t seed, float* out_keys,
                      int64_t* out_idx) const;

  // k distinct items uniformly from the unmasked ones, for each of Q queries (row q uses the
  // stream (seed, q)). Writes Q x k ids.
  void sample_random(int64_t Q, int64_t k, const ExcludeLists& ex, uint64_t seed,
                     int64_t* out_idx) const;

  // raw access (for kernels)
  const float* f32() const noexcept { return f32_.data(); }
  const uint16_t* f16() const noexcept { return f16_.data(); }
  const int8_t* i8() const noexcept { return i8_.data(); }
  const float* scales() const noexcept { return scale_.data(); }

 private:
  void select_(const float* U, int64_t Q, int64_t k, const ExcludeLists& ex, bool gumbel,
               double temperature, uint64_t seed, float* out_s, int64_t* out_i) const;

  int64_t n_ = 0, d_ = 0;
  Storage storage_;
  int threads_ = 1;
  std::vector<float> f32_;
  std::vector<uint16_t> f16_;
  std::vector<int8_t> i8_;
  std::vector<float> scale_;
};

// One query's incremental least-squares state over rows of a Features object (which must
// outlive it). Regime |A| < d: Cholesky factor of V[A] V[A]^T + delta I; regime |A| >= d:
// Cholesky factor of V[A]^T V[A] + delta I; both extended block-wise as rows arrive.
// ridge > 0: delta = ridge and solve() returns (X^T X + ridge I)^-1 X^T a exactly.
// ridge = 0: delta = jitter_rel * max_i ||x_i||^2 (1e-10 by default) and `refine` steps of
// iterated Tikhonov refinement bring the result to the min-norm least-squares (pinv) solution
// (error factor (delta / (sigma^2 + delta))^(refine+1) per singular direction); directions with
// sigma^2 well below delta (numerical rank deficiency) are dropped, as pinv with rcond would.
class LeastSquares {
 public:
  explicit LeastSquares(const Features& features, double ridge = 0.0, int refine = 3,
                        double jitter_rel = 1e-10);

  // Items must be new (not yet in the state, no repeats in the call), in [0, N); targets finite.
  void append(const int64_t* items, const double* targets, int64_t m);
  // u (d doubles). With a prior set, u = (1 - mix) u_ls + mix prior.
  void solve(double* u) const;
  void set_prior(const double* prior, double mix);  // prior == nullptr clears it
  void clear_prior();

  int64_t size() const noexcept { return m_; }
  int64_t dim() const noexcept { return d_; }
  double ridge() const noexcept { return ridge_; }
  bool primal() const noexcept { return primal_; }  // true once |A| >= d
  std::vector<int64_t> items() const;   // copies, taken under the state's lock
  std::vector<double> targets() const;
  double delta() const noexcept { return delta_; }

 private:
  void refactor_();
  void extend_dual_(int64_t m0);
  void extend_primal_(int64_t m0);
  void apply_inv_(double* v) const;  // v <- (F + delta I)^-1 v using the current factor

  const Features* f_;
  int64_t d_;
  double ridge_, jitter_rel_;
  int refine_;
  int64_t m_ = 0;
  std::vector<int64_t> items_;
  std::unordered_set<int64_t> seen_;
  std::vector<double> X_;  // m x d rows, double
  std::vector<double> a_;
  bool primal_ = false;
  double delta_ = 0.0, scale_ = 0.0;  // scale_: max row norm^2 delta was derived from
  // dual: L lower-triangular m x m, row-major with stride cap_ (grown by doubling)
  // primal: R upper-triangular d x d, row-major (R^T R = X^T X + delta I)
  std::vector<double> L_;
  int64_t cap_ = 0;
  std::vector<double> R_;
  std::vector<double> prior_;
  double mix_ = 0.0;
  mutable std::mutex mu_;
};

}  // namespace crossknn
