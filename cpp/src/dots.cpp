// Multi-dot kernels of the incremental solvers (see dots.h).
#include "dots.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace crossknn::detail {

namespace {

// local accumulators (the output may not alias them), copied out at the end
template <int NA>
inline void partial_generic(const double* const* a, const double* b, int64_t n,
                            double (*out)[8]) {
  double s[NA][8];
  for (int t = 0; t < NA; ++t)
    for (int l = 0; l < 8; ++l) s[t][l] = 0.0;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int t = 0; t < NA; ++t)
      for (int l = 0; l < 8; ++l) s[t][l] += a[t][j + l] * b[j + l];
  for (; j < n; ++j)
    for (int t = 0; t < NA; ++t) s[t][0] += a[t][j] * b[j];
  for (int t = 0; t < NA; ++t)
    for (int l = 0; l < 8; ++l) out[t][l] = s[t][l];
}

#if defined(__x86_64__) && defined(__GNUC__)
// the same sums with AVX: partial sums 0-3 and 4-7 in two registers, multiply then add (the core
// is built with -ffp-contract=off: no FMA), so every partial sum is the generic one
template <int NA>
__attribute__((target("avx"))) void partial_avx(const double* const* a, const double* b,
                                                int64_t n, double (*out)[8]) {
  __m256d lo[NA], hi[NA];
  for (int t = 0; t < NA; ++t) lo[t] = hi[t] = _mm256_setzero_pd();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256d b0 = _mm256_loadu_pd(b + j), b1 = _mm256_loadu_pd(b + j + 4);
    for (int t = 0; t < NA; ++t) {
      lo[t] = _mm256_add_pd(lo[t], _mm256_mul_pd(_mm256_loadu_pd(a[t] + j), b0));
      hi[t] = _mm256_add_pd(hi[t], _mm256_mul_pd(_mm256_loadu_pd(a[t] + j + 4), b1));
    }
  }
  for (int t = 0; t < NA; ++t) {
    _mm256_storeu_pd(out[t], lo[t]);
    _mm256_storeu_pd(out[t] + 4, hi[t]);
  }
  for (; j < n; ++j)
    for (int t = 0; t < NA; ++t) out[t][0] += a[t][j] * b[j];
}

// float32 inputs (exact in double): the products and sums of partial_avx, half the bytes read
template <int NA>
__attribute__((target("avx"))) void partial_avx_f(const float* const* a, const float* b,
                                                  int64_t n, double (*out)[8]) {
  __m256d lo[NA], hi[NA];
  for (int t = 0; t < NA; ++t) lo[t] = hi[t] = _mm256_setzero_pd();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256d b0 = _mm256_cvtps_pd(_mm_loadu_ps(b + j)),
                  b1 = _mm256_cvtps_pd(_mm_loadu_ps(b + j + 4));
    for (int t = 0; t < NA; ++t) {
      lo[t] = _mm256_add_pd(lo[t], _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(a[t] + j)), b0));
      hi[t] =
          _mm256_add_pd(hi[t], _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(a[t] + j + 4)), b1));
    }
  }
  for (int t = 0; t < NA; ++t) {
    _mm256_storeu_pd(out[t], lo[t]);
    _mm256_storeu_pd(out[t] + 4, hi[t]);
  }
  for (; j < n; ++j)
    for (int t = 0; t < NA; ++t)
      out[t][0] += static_cast<double>(a[t][j]) * static_cast<double>(b[j]);
}

// a tile of 4 rows x 8 columns of G over all t: G += (or -=) x_t[i] x_t[j]
template <bool Sub>
__attribute__((target("avx"))) void tile_avx(const double* X, int64_t m, int64_t d, int64_t i0,
                                             int64_t j0, double* G) {
  __m256d acc[4][2];
  for (int r = 0; r < 4; ++r) {
    acc[r][0] = _mm256_loadu_pd(G + (i0 + r) * d + j0);
    acc[r][1] = _mm256_loadu_pd(G + (i0 + r) * d + j0 + 4);
  }
  for (int64_t t = 0; t < m; ++t) {
    const double* x = X + t * d;
    const __m256d b0 = _mm256_loadu_pd(x + j0), b1 = _mm256_loadu_pd(x + j0 + 4);
    for (int r = 0; r < 4; ++r) {
      const __m256d a = _mm256_broadcast_sd(x + i0 + r);
      if (Sub) {  // y + (-a) b == y - a b exactly
        acc[r][0] = _mm256_sub_pd(acc[r][0], _mm256_mul_pd(a, b0));
        acc[r][1] = _mm256_sub_pd(acc[r][1], _mm256_mul_pd(a, b1));
      } else {
        acc[r][0] = _mm256_add_pd(acc[r][0], _mm256_mul_pd(a, b0));
        acc[r][1] = _mm256_add_pd(acc[r][1], _mm256_mul_pd(a, b1));
      }
    }
  }
  for (int r = 0; r < 4; ++r) {
    _mm256_storeu_pd(G + (i0 + r) * d + j0, acc[r][0]);
    _mm256_storeu_pd(G + (i0 + r) * d + j0 + 4, acc[r][1]);
  }
}

bool has_avx() {
  static const bool yes = [] {
    __builtin_cpu_init();
    const char* e = std::getenv("CROSSKNN_NO_SIMD");
    return !(e && *e && std::strcmp(e, "0") != 0) && __builtin_cpu_supports("avx");
  }();
  return yes;
}

template <int NA>
void partial_f(const float* const* a, const float* b, int64_t n, double (*out)[8]) {
  if (has_avx()) {
    partial_avx_f<NA>(a, b, n, out);
    return;
  }
  double s[NA][8];
  for (int t = 0; t < NA; ++t)
    for (int l = 0; l < 8; ++l) s[t][l] = 0.0;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int t = 0; t < NA; ++t)
      for (int l = 0; l < 8; ++l)
        s[t][l] += static_cast<double>(a[t][j + l]) * static_cast<double>(b[j + l]);
  for (; j < n; ++j)
    for (int t = 0; t < NA; ++t) s[t][0] += static_cast<double>(a[t][j]) * b[j];
  for (int t = 0; t < NA; ++t)
    for (int l = 0; l < 8; ++l) out[t][l] = s[t][l];
}

template <int NA>
void partial(const double* const* a, const double* b, int64_t n, double (*out)[8]) {
  if (has_avx())
    partial_avx<NA>(a, b, n, out);
  else
    partial_generic<NA>(a, b, n, out);
}
#else
template <int NA>
void partial(const double* const* a, const double* b, int64_t n, double (*out)[8]) {
  partial_generic<NA>(a, b, n, out);
}
template <int NA>
void partial_f(const float* const* a, const float* b, int64_t n, double (*out)[8]) {
  double s[NA][8];
  for (int t = 0; t < NA; ++t)
    for (int l = 0; l < 8; ++l) s[t][l] = 0.0;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int t = 0; t < NA; ++t)
      for (int l = 0; l < 8; ++l)
        s[t][l] += static_cast<double>(a[t][j + l]) * static_cast<double>(b[j + l]);
  for (; j < n; ++j)
    for (int t = 0; t < NA; ++t) s[t][0] += static_cast<double>(a[t][j]) * b[j];
  for (int t = 0; t < NA; ++t)
    for (int l = 0; l < 8; ++l) out[t][l] = s[t][l];
}
#endif

inline double reduce(DotOrder order, const double* s) {
  if (order == DotOrder::Interleaved)
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void dots4(const double* const* a, const double* b, int64_t n, double (*s)[8]) {
  partial<4>(a, b, n, s);
}
void dots2(const double* const* a, const double* b, int64_t n, double (*s)[8]) {
  partial<2>(a, b, n, s);
}
void dots1(const double* const* a, const double* b, int64_t n, double (*s)[8]) {
  partial<1>(a, b, n, s);
}

}  // namespace

void dots(DotOrder order, const double* const* a, int na, const double* b, int64_t n,
          double* out) {
  double s[4][8];
  int t = 0;
  for (; t + 4 <= na; t += 4) {
    dots4(a + t, b, n, s);
    for (int k = 0; k < 4; ++k) out[t + k] = reduce(order, s[k]);
  }
  for (; t + 2 <= na; t += 2) {
    dots2(a + t, b, n, s);
    for (int k = 0; k < 2; ++k) out[t + k] = reduce(order, s[k]);
  }
  for (; t < na; ++t) {
    dots1(a + t, b, n, s);
    out[t] = reduce(order, s[0]);
  }
}

void dots_f(DotOrder order, const float* const* a, int na, const float* b, int64_t n,
            double* out) {
  double s[4][8];
  int t = 0;
  for (; t + 4 <= na; t += 4) {
    partial_f<4>(a + t, b, n, s);
    for (int k = 0; k < 4; ++k) out[t + k] = reduce(order, s[k]);
  }
  for (; t + 2 <= na; t += 2) {
    partial_f<2>(a + t, b, n, s);
    for (int k = 0; k < 2; ++k) out[t + k] = reduce(order, s[k]);
  }
  for (; t < na; ++t) {
    partial_f<1>(a + t, b, n, s);
    out[t] = reduce(order, s[0]);
  }
}

int64_t gram_tiles(const double* X, int64_t m, int64_t d, double* G) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (!has_avx()) return 0;
  const int64_t rows = d / 4 * 4;
  for (int64_t i0 = 0; i0 < rows; i0 += 4) {
    int64_t j0 = i0;
    for (; j0 + 8 <= d; j0 += 8) tile_avx<false>(X, m, d, i0, j0, G);
    for (int64_t t = 0; t < m; ++t) {  // the last < 8 columns, in the same order
      const double* x = X + t * d;
      for (int64_t i = i0; i < i0 + 4; ++i)
        for (int64_t j = std::max(j0, i); j < d; ++j) G[i * d + j] += x[i] * x[j];
    }
  }
  return rows;
#else
  (void)X, (void)m, (void)d, (void)G;
  return 0;
#endif
}

bool chol_block_update(const double* R, int64_t d, int64_t i0, double* G) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (!has_avx() || i0 + 4 > d) return false;
  int64_t j0 = i0;
  for (; j0 + 8 <= d; j0 += 8) tile_avx<true>(R, i0, d, i0, j0, G);
  for (int64_t k = 0; k < i0; ++k) {  // the last < 8 columns, in the same order
    const double* rk = R + k * d;
    for (int64_t i = i0; i < i0 + 4; ++i)
      for (int64_t j = std::max(j0, i); j < d; ++j) G[i * d + j] += -rk[i] * rk[j];
  }
  return true;
#else
  (void)R, (void)d, (void)i0, (void)G;
  return false;
#endif
}

double dot1(DotOrder order, const double* a, const double* b, int64_t n) {
  double out;
  dots(order, &a, 1, b, n, &out);
  return out;
}

}  // namespace crossknn::detail
