#pragma once
// Internal: the item Gram cache of the least-squares rounds (ADACUR, AXN).
//
// While a query has scored fewer items than there are feature columns (|A| < d), the solver's
// u lies in the span of the scored rows: u = sum_t c_t x_{a_t}. Then the approximate score of
// item j is sum_t c_t (x_j . x_{a_t}), |A| entries of G = V V^T instead of d feature values,
// and the solver's Gram entries x_i . x_j are lookups. With G in memory (N^2 doubles), a round
// reads 8 |A| bytes per item instead of the int8 prefilter's d: for ADACUR on NFCorpus (N =
// 3,633, d = 1,677) at B = 100, 160-640 bytes a round instead of 1,677.
//
// Exactness. G's entries are the solver's own bits (dots_f, DotOrder::Interleaved), so the
// solver's factor is unchanged; the top-k uses G only to bound every item's exact float32
// score (features.cpp's rescoring kernel on u rounded to float32) and rescores the candidates
// with that kernel: the same items and keys as Features::top_k.
//
// Memory: G is built once per matrix (shared by all handles) for float32 storage when N^2 x 8
// bytes fit CROSSKNN_GRAM_MB (MiB; default 256, 0 turns the cache off), once max(64, N / 8)
// searches with least-squares rounds have run (or on Features::prepare_gram).
#include <cstdint>
#include <functional>

#include "crossknn/features.h"
#include "features_impl.h"

namespace crossknn::detail {

// The cache of fd if it is built, else nullptr (never builds).
const ItemGram* ready_gram(const FeatureData& fd) noexcept;
// Builds the cache once if the matrix qualifies (float32, N^2 x 8 bytes within the limit);
// nullptr when it does not. Blocks concurrent callers until the build is done.
const ItemGram* build_gram(const FeatureData& fd, int threads);
int64_t gram_limit_bytes() noexcept;

// The PriorRidge solve's kernel entries x_i o inv . x_j (search.cpp) for the inverse penalties
// inv (d values): the cache of the first inv it was built for (nullptr for another inv).
const WeightedGram* ready_weighted_gram(const FeatureData& fd, const double* inv) noexcept;
const WeightedGram* build_weighted_gram(const FeatureData& fd, const double* inv, int threads);

// Top k of V U (one query, U = float32(u)) with u = sum_t coef[t] x_{span[t]} + e, ||e|| <=
// u_err: the same items and float32 keys as Features::top_k(U, 1, k, ex). false: declined
// (too many candidates, a non-finite score); the caller then runs Features::top_k.
bool gram_top_k(const FeatureData& fd, const ItemGram& G, const float* U, const double* u,
                const int64_t* span, const double* coef, int64_t m, double u_err, int64_t k,
                const ExcludeLists& ex, float* out_s, int64_t* out_i);

// features.cpp: the float32 rounding factor of one exact score (|s - v.u| <= gamma ||v|| ||u||
// plus d subnormal steps of 2^-149), and the top k of one query from per-item bounds: `bounds`
// (r0, r1, s, e) writes approximate scores s and bounds e (|exact float32 score - s| <= e) for
// rows [r0, r1) (at most bs); rows whose upper bound reaches the k-th largest lower bound are
// rescored exactly. false: declined (more than max_candidates rows, a non-finite score).
double float32_score_gamma(int64_t d);
using BoundsFn = std::function<void(int64_t r0, int64_t r1, double* s, double* e)>;
bool bounded_top_k(const FeatureData& fd, const float* u, int64_t k, const ExcludeLists& ex,
                   int64_t bs, const BoundsFn& bounds, int64_t max_candidates, float* out_s,
                   int64_t* out_i);

}  // namespace crossknn::detail
