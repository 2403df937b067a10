#pragma once
// Internal: score kernels (V rows x queries) with one SIMD path chosen at run time, and a tiny
// thread pool helper. Every query's score is computed with the same operation order whatever
// the block, thread or batch it lands in, so results never depend on the thread count.
#include <cstdint>
#include <exception>
#include <functional>
#include <vector>

#include "features_impl.h"

namespace crossknn::detail {

// The queries of one call, prepared once. For int8 storage the scores are computed in exact
// integer arithmetic against u rounded to int16 with a per-query scale su = max|u| / 32767:
// score = (sum_j q_rj * uq_j) * su * scale_r. The added error is below
// sum_j |v_rj| * max|u| / 65534, far under the int8 rounding of V itself.
struct Queries {
  const float* U = nullptr;
  int64_t Q = 0, d = 0;
  std::vector<int16_t> uq;  // int8 storage only: Q x d
  std::vector<double> su;
};
Queries prepare_queries(const FeatureData& f, const float* U, int64_t Q);

// out[q * ld + (r - r0)] = score of row r for query q, r in [r0, r1).
void block_scores(const FeatureData& f, int64_t r0, int64_t r1, const Queries& qs, float* out,
                  int64_t ld);

// Scores of the rows `rows[0..m)` for one query u (float32 or float16 storage), each computed
// with exactly the operations block_scores uses for that row: the same float bits.
void gather_scores(const FeatureData& f, const int64_t* rows, int64_t m, const float* u,
                   float* out);

// Exact integer sums out[r - r0] = sum_j V[r][j] * uq[j] for rows [r0, r1) of an int8 matrix
// (n x d, row-major) against one int16 query; the same values on every kernel path.
void int8_totals(const int8_t* V, int64_t d, int64_t r0, int64_t r1, const int16_t* uq,
                 int64_t* out);

// The int8 prefilter's approximate score and error bound of rows [0, nb) for one query
// (features.cpp, int8_candidates, derives the bound): from the exact integer totals t,
//   s_x = t_x * scale_x * su + cs
//   e_x = (dq_x * wn + err_x * unq + gx_x * un) * (1 + 1e-9) + 4.5e-16 |a_x| + 2.3e-16 |s_x|
//         + ce + tiny,   a_x = t_x * scale_x * su,
// each operation as written, left to right (the same bits on every kernel path).
struct Int8Bound {
  double su, cs, wn, unq, un, ce, tiny;
};
void int8_bounds(const int64_t* t, int64_t nb, const double* scale, const double* dq,
                 const double* err, const double* gx, const Int8Bound& b, double* s, double* e);

// The rows x in [0, nb) whose upper bound s_x + e_x reaches thr, ascending, into idx (room for
// nb); returns how many. The prefilter's candidates pass through it: most rows fail once a
// query's threshold is known, and those cost a vector compare instead of a branch.
int64_t rows_reaching(const double* s, const double* e, int64_t nb, double thr, int32_t* idx);

// Scores of rows [r0, r1) of a float16 matrix (n x d) for one query, for the top-k prefilter:
// any summation order whose paths have at most d + 64 rounded operations (the prefilter's error
// bound), here four rows at a time; out[r - r0].
void shadow_scores(const uint16_t* H, int64_t d, int64_t r0, int64_t r1, const float* u,
                   float* out);

// The SIMD level of this process, chosen once from the CPU and the environment:
// CROSSKNN_NO_SIMD=1 (or CROSSKNN_SIMD=generic) forces Generic, CROSSKNN_SIMD=avx2 caps it at
// Avx2 (the kernels before AVX-512, kept to compare against bit for bit). Every level gives the
// same results (bit for bit, except the float32/float16 full scores of the generic path).
enum class SimdLevel { Generic = 0, Avx2 = 1, Avx512 = 2 };
SimdLevel simd_level() noexcept;
// Whether the environment forces the portable path (CROSSKNN_NO_SIMD=1, CROSSKNN_SIMD=generic).
bool simd_disabled() noexcept;

// shadow_scores for the rows `rows[0..m)` (any order, repeats allowed): out[t] for rows[t].
void shadow_rows(const uint16_t* H, int64_t d, const int64_t* rows, int64_t m, const float* u,
                 float* out);

// Name of the kernel set in use ("avx512", "avx2" or "generic").
const char* kernel_name() noexcept;

// float <-> IEEE half (round to nearest even)
uint16_t float_to_half(float f) noexcept;
float half_to_float(uint16_t h) noexcept;

// Runs body(worker, task) for task in [0, n_tasks) on up to `threads` threads (the caller is
// worker 0); tasks are handed out dynamically. The first exception thrown stops the hand-out and
// is rethrown after all threads joined.
void parallel_for(int threads, int64_t n_tasks, const std::function<void(int, int64_t)>& body);

inline uint64_t mix64(uint64_t z) noexcept {  // splitmix64 finaliser
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
// counter-based stream key of (seed, query row)
inline uint64_t stream_key(uint64_t seed, uint64_t q) noexcept {
  return mix64(mix64(seed) ^ (q * 0xd1b54a32d192ed03ULL + 0x632be59bd9b4e019ULL));
}
// uniform double in (0, 1) for (stream, counter)
inline double uniform01(uint64_t key, uint64_t i) noexcept {
  uint64_t h = mix64(key ^ mix64(i));
  return (static_cast<double>(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

}  // namespace crossknn::detail
