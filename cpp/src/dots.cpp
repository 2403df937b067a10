// Multi-dot kernels of the incremental solvers (see dots.h).
#include "dots.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels.h"
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

// partial_generic's sums for float32 inputs (the products and sums in double)
template <int NA>
void partial_generic_f(const float* const* a, const float* b, int64_t n, double (*out)[8]) {
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

// ---- AVX-512: the same eight partial sums in one register (lane l = partial sum l) ----------
#define CROSSKNN_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")))

// partial_avx's sums, one register per row: multiply then add (any doubles: no FMA)
template <int NA>
CROSSKNN_AVX512 void partial_avx512(const double* const* a, const double* b, int64_t n,
                                    double (*out)[8]) {
  __m512d acc[NA];
  for (int t = 0; t < NA; ++t) acc[t] = _mm512_setzero_pd();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m512d bj = _mm512_loadu_pd(b + j);
    for (int t = 0; t < NA; ++t)
      acc[t] = _mm512_add_pd(acc[t], _mm512_mul_pd(_mm512_loadu_pd(a[t] + j), bj));
  }
  for (int t = 0; t < NA; ++t) _mm512_storeu_pd(out[t], acc[t]);
  for (; j < n; ++j)
    for (int t = 0; t < NA; ++t) out[t][0] += a[t][j] * b[j];
}

// partial_avx512's sums of NA rows against two vectors at once (2 NA independent chains)
template <int NA>
CROSSKNN_AVX512 void partial2_avx512(const double* const* a, const double* b0, const double* b1,
                                     int64_t n, double (*out0)[8], double (*out1)[8]) {
  __m512d acc0[NA], acc1[NA];
  for (int t = 0; t < NA; ++t) acc0[t] = acc1[t] = _mm512_setzero_pd();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m512d c0 = _mm512_loadu_pd(b0 + j), c1 = _mm512_loadu_pd(b1 + j);
    for (int t = 0; t < NA; ++t) {
      const __m512d x = _mm512_loadu_pd(a[t] + j);
      acc0[t] = _mm512_add_pd(acc0[t], _mm512_mul_pd(x, c0));
      acc1[t] = _mm512_add_pd(acc1[t], _mm512_mul_pd(x, c1));
    }
  }
  for (int t = 0; t < NA; ++t) {
    _mm512_storeu_pd(out0[t], acc0[t]);
    _mm512_storeu_pd(out1[t], acc1[t]);
  }
  for (; j < n; ++j)
    for (int t = 0; t < NA; ++t) {
      out0[t][0] += a[t][j] * b0[j];
      out1[t][0] += a[t][j] * b1[j];
    }
}

// float32 inputs: the product of two floats is exact in double, so fma(a, b, s) rounds once,
// exactly as s + a * b does: FMAs give the bits of the multiply-then-add sums
template <int NA>
CROSSKNN_AVX512 void partial_avx512_f(const float* const* a, const float* b, int64_t n,
                                      double (*out)[8]) {
  __m512d acc[NA];
  for (int t = 0; t < NA; ++t) acc[t] = _mm512_setzero_pd();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m512d bj = _mm512_cvtps_pd(_mm256_loadu_ps(b + j));
    for (int t = 0; t < NA; ++t)
      acc[t] = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_loadu_ps(a[t] + j)), bj, acc[t]);
  }
  for (int t = 0; t < NA; ++t) _mm512_storeu_pd(out[t], acc[t]);
  for (; j < n; ++j)
    for (int t = 0; t < NA; ++t)
      out[t][0] += static_cast<double>(a[t][j]) * static_cast<double>(b[j]);
}

// a tile of 4 rows x 32 columns of G over all t (masked past column `j1`): G += x_t[i] x_t[j]
// with FMAs (X holds float values: products exact) or, Sub, G -= x_t[i] x_t[j] as a multiply
// then a subtract (any doubles)
template <bool Sub>
CROSSKNN_AVX512 void tile_avx512(const double* X, int64_t m, int64_t d, int64_t i0, int64_t j0,
                                 int64_t j1, double* G) {
  __mmask8 mk[4];
  for (int c = 0; c < 4; ++c) {
    const int64_t left = std::min<int64_t>(8, std::max<int64_t>(0, j1 - (j0 + 8 * c)));
    mk[c] = static_cast<__mmask8>((1u << left) - 1u);
  }
  __m512d acc[4][4];
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c)
      acc[r][c] = _mm512_maskz_loadu_pd(mk[c], G + (i0 + r) * d + j0 + 8 * c);
  for (int64_t t = 0; t < m; ++t) {
    const double* x = X + t * d;
    __m512d b[4];
    for (int c = 0; c < 4; ++c) b[c] = _mm512_maskz_loadu_pd(mk[c], x + j0 + 8 * c);
    for (int r = 0; r < 4; ++r) {
      const __m512d a = _mm512_set1_pd(x[i0 + r]);
      for (int c = 0; c < 4; ++c) {
        if (Sub)  // y + (-a) b == y - a b exactly
          acc[r][c] = _mm512_sub_pd(acc[r][c], _mm512_mul_pd(a, b[c]));
        else
          acc[r][c] = _mm512_fmadd_pd(a, b[c], acc[r][c]);
      }
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c)
      _mm512_mask_storeu_pd(G + (i0 + r) * d + j0 + 8 * c, mk[c], acc[r][c]);
}

bool has_avx() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return !simd_disabled() && __builtin_cpu_supports("avx");
  }();
  return yes;
}

bool has_avx512() { return simd_level() == SimdLevel::Avx512; }

template <int NA>
void partial_f(const float* const* a, const float* b, int64_t n, double (*out)[8]) {
  if (has_avx512()) {
    partial_avx512_f<NA>(a, b, n, out);
    return;
  }
  if (has_avx()) {
    partial_avx_f<NA>(a, b, n, out);
    return;
  }
  partial_generic_f<NA>(a, b, n, out);
}

template <int NA>
void partial(const double* const* a, const double* b, int64_t n, double (*out)[8]) {
  if (has_avx512())
    partial_avx512<NA>(a, b, n, out);
  else if (has_avx())
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
  partial_generic_f<NA>(a, b, n, out);
}
#endif

inline double reduce(DotOrder order, const double* s) {
  if (order == DotOrder::Interleaved)
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

#if defined(__x86_64__) && defined(__GNUC__)
// Gram panel: 8 rows of `a` (double, stride lda) against NB float32 rows (b + u * ldb) over
// `len` columns (a multiple of 8), continuing the eight partial sums of each pair from acc
// (acc[u]: 8 rows x 8 lanes); FMAs, exact as above.
template <int NB>
CROSSKNN_AVX512 void panel_avx512(const double* a, int64_t lda, const float* b, int64_t ldb,
                                  int64_t len, bool first, double* const* acc) {
  __m512d s[8][NB];
  for (int t = 0; t < 8; ++t)
    for (int u = 0; u < NB; ++u)
      s[t][u] = first ? _mm512_setzero_pd() : _mm512_loadu_pd(acc[u] + 8 * t);
  for (int64_t c = 0; c < len; c += 8) {
    __m512d bv[NB];
    for (int u = 0; u < NB; ++u) bv[u] = _mm512_cvtps_pd(_mm256_loadu_ps(b + u * ldb + c));
    for (int t = 0; t < 8; ++t) {
      const __m512d av = _mm512_loadu_pd(a + t * lda + c);
      for (int u = 0; u < NB; ++u) s[t][u] = _mm512_fmadd_pd(av, bv[u], s[t][u]);
    }
  }
  for (int t = 0; t < 8; ++t)
    for (int u = 0; u < NB; ++u) _mm512_storeu_pd(acc[u] + 8 * t, s[t][u]);
}

// gram_rows_f for up to kRows rows: columns in chunks of kChunk (the chunk of the i rows, in
// double, stays in L1 while every j row passes), the partial sums of all pairs kept in memory
// between chunks; every partial sum still adds its products in column order.
constexpr int kRows = 16;
constexpr int64_t kChunk = 256;

CROSSKNN_AVX512 void gram_block_avx512(DotOrder order, const float* X, int64_t ld, int64_t n,
                                       int64_t i0, int64_t i1, int64_t j1, double* out,
                                       int64_t ldo) {
  const int na = static_cast<int>(i1 - i0);
  const int tiles = (na + 7) / 8;
  const int64_t n8 = n / 8 * 8;
  // (no zeroing: the first chunk starts its sums at zero, and rows past na read zeros)
  thread_local std::vector<double> abuf, accs;
  if (abuf.size() < static_cast<size_t>(kRows * kChunk))
    abuf.resize(static_cast<size_t>(kRows * kChunk));
  if (accs.size() < static_cast<size_t>(j1 * kRows * 8))
    accs.resize(static_cast<size_t>(j1 * kRows * 8));
  std::fill(abuf.begin() + na * kChunk, abuf.begin() + tiles * 8 * kChunk, 0.0);
  if (n8 == 0)
    std::fill(accs.begin(), accs.begin() + j1 * kRows * 8, 0.0);
  for (int64_t c0 = 0; c0 < n8; c0 += kChunk) {
    const int64_t len = std::min(kChunk, n8 - c0);
    for (int t = 0; t < na; ++t)
      for (int64_t c = 0; c < len; ++c) abuf[t * kChunk + c] = X[(i0 + t) * ld + c0 + c];
    int64_t j = 0;
    for (; j < j1; j += 2) {
      const int nb = j + 2 <= j1 ? 2 : 1;
      for (int tile = 0; tile < tiles; ++tile) {
        if (i0 + 8 * tile + 7 <= j) continue;  // no row of the tile pairs with j (j >= i)
        double* acc[2] = {accs.data() + (j * kRows + 8 * tile) * 8, nullptr};
        if (nb == 2) acc[1] = accs.data() + ((j + 1) * kRows + 8 * tile) * 8;
        const double* at = abuf.data() + 8 * tile * kChunk;
        if (nb == 2)
          panel_avx512<2>(at, kChunk, X + j * ld + c0, ld, len, c0 == 0, acc);
        else
          panel_avx512<1>(at, kChunk, X + j * ld + c0, ld, len, c0 == 0, acc);
      }
    }
  }
  for (int t = 0; t < na; ++t) {
    const float* xi = X + (i0 + t) * ld;
    for (int64_t j = 0; j < std::min(j1, i0 + t); ++j) {
      double* sp = accs.data() + (j * kRows + t) * 8;
      const float* xj = X + j * ld;
      for (int64_t c = n8; c < n; ++c)
        sp[0] += static_cast<double>(xi[c]) * static_cast<double>(xj[c]);
      out[t * ldo + j] = reduce(order, sp);
    }
  }
}
#endif

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

void dots2v(DotOrder order, const double* const* a, int na, const double* b0, const double* b1,
            int64_t n, double* out0, double* out1) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (has_avx512()) {
    double s0[4][8], s1[4][8];
    switch (na) {
      case 4:
        partial2_avx512<4>(a, b0, b1, n, s0, s1);
        break;
      case 3:
        partial2_avx512<3>(a, b0, b1, n, s0, s1);
        break;
      case 2:
        partial2_avx512<2>(a, b0, b1, n, s0, s1);
        break;
      default:
        partial2_avx512<1>(a, b0, b1, n, s0, s1);
    }
    for (int t = 0; t < na; ++t) {
      out0[t] = reduce(order, s0[t]);
      out1[t] = reduce(order, s1[t]);
    }
    return;
  }
#endif
  dots(order, a, na, b0, n, out0);
  dots(order, a, na, b1, n, out1);
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

void gram_rows_f(DotOrder order, const float* X, int64_t ld, int64_t n, int64_t i0, int64_t i1,
                 int64_t j1, double* out, int64_t ldo) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (has_avx512()) {
    for (int64_t b0 = i0; b0 < i1; b0 += kRows)
      gram_block_avx512(order, X, ld, n, b0, std::min(i1, b0 + kRows), j1,
                        out + (b0 - i0) * ldo, ldo);
    return;
  }
#endif
  // four rows at a time against each j (the rows with j < i)
  const float* rows[4];
  double o[4];
  for (int64_t t0 = i0; t0 < i1; t0 += 4) {
    const int64_t t1 = std::min(i1, t0 + 4);
    for (int64_t j = 0; j < std::min(j1, t1 - 1); ++j) {
      const int64_t first = std::max(t0, j + 1);
      int k = 0;
      for (int64_t i = first; i < t1; ++i) rows[k++] = X + i * ld;
      dots_f(order, rows, k, X + j * ld, n, o);
      for (int t = 0; t < k; ++t) out[(first - i0 + t) * ldo + j] = o[t];
    }
  }
}

int64_t gram_tiles(const double* X, int64_t m, int64_t d, double* G, int threads) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (has_avx512()) {
    // blocks of four rows write disjoint rows of G: on threads, paired from both ends of the
    // triangle so that every task has about the same work
    const int64_t rows = d / 4 * 4, nb = rows / 4;
    auto block = [&](int64_t b) {
      for (int64_t j0 = 4 * b; j0 < d; j0 += 32) tile_avx512<false>(X, m, d, 4 * b, j0, d, G);
    };
    parallel_for(threads, (nb + 1) / 2, [&](int, int64_t p) {
      block(p);
      if (nb - 1 - p != p) block(nb - 1 - p);
    });
    return rows;
  }
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
  if (i0 + 4 > d) return false;
  if (has_avx512()) {
    for (int64_t j0 = i0; j0 < d; j0 += 32) tile_avx512<true>(R, i0, d, i0, j0, d, G);
    return true;
  }
  if (!has_avx()) return false;
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
