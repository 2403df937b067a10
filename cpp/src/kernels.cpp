// Score kernels. The core is compiled with -ffp-contract=off, so the generic path does
// mul-then-add exactly as written; the AVX2 path uses explicit FMAs. One path is chosen per
// process (CPU features, CROSSKNN_NO_SIMD, CROSSKNN_SIMD: simd_level()), never per call.
#include "kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define CROSSKNN_X86 1
#endif

namespace crossknn::detail {

uint16_t float_to_half(float f) noexcept {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (ax < 0x38800000u) {                                               // subnormal half (or zero)
    if (ax < 0x33000000u) return static_cast<uint16_t>(sign);           // < 2^-25: rounds to 0
    const uint32_t e = ax >> 23;
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // 14 + (113 - e) ... value = m * 2^(e-150); half unit 2^-24
    // half mantissa = m >> (shift - 0) with rounding; shift in [14, 24]
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = ((ax >> 23) - 112u) << 10 | ((ax >> 13) & 0x3ffu);
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: fine
  return static_cast<uint16_t>(sign | h);
}

float half_to_float(uint16_t h) noexcept {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  uint32_t x;
  if (e == 0) {
    if (m == 0) {
      x = sign;
    } else {  // subnormal: normalise
      e = 113;
      while (!(m & 0x400u)) {
        m <<= 1;
        --e;
      }
      x = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
  } else if (e == 31) {
    x = sign | 0x7f800000u | (m << 13);
  } else {
    x = sign | ((e + 112u) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

namespace {

// ---------------- generic path: 8 lanes emulated, two lane groups, fixed reduction order -----
template <class Load>
inline float dot_generic(const Load& load, const float* u, int64_t d) {
  float acc[16] = {0};
  int64_t j = 0;
  for (; j + 16 <= d; j += 16)
    for (int l = 0; l < 16; ++l) acc[l] = acc[l] + load(j + l) * u[j + l];
  float s = 0.f;
  for (int l = 0; l < 16; ++l) s = s + acc[l];
  for (; j < d; ++j) s = s + load(j) * u[j];
  return s;
}

inline float int8_score(int64_t total, double su, float scale) {
  return static_cast<float>(static_cast<double>(total) * su * static_cast<double>(scale));
}

void scores_generic(const FeatureData& f, int64_t r0, int64_t r1, const Queries& qs, float* out,
                    int64_t ld) {
  const int64_t d = f.dim(), Q = qs.Q;
  const float* U = qs.U;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t q = 0; q < Q; ++q) {
      const float* u = U + q * d;
      float s;
      switch (f.storage()) {
        case Storage::Float32: {
          const float* v = f.f32() + r * d;
          s = dot_generic([v](int64_t j) { return v[j]; }, u, d);
          break;
        }
        case Storage::Float16: {
          const uint16_t* v = f.f16() + r * d;
          s = dot_generic([v](int64_t j) { return half_to_float(v[j]); }, u, d);
          break;
        }
        default: {
          const int8_t* v = f.i8() + r * d;
          const int16_t* uq = qs.uq.data() + q * d;
          int64_t total = 0;
          for (int64_t j = 0; j < d; ++j) total += static_cast<int64_t>(v[j]) * uq[j];
          s = int8_score(total, qs.su[q], f.scales()[r]);
        }
      }
      out[q * ld + (r - r0)] = s;
    }
  }
}

float score_generic_row(const FeatureData& f, int64_t r, const float* u) {
  const int64_t d = f.dim();
  if (f.storage() == Storage::Float32) {
    const float* v = f.f32() + r * d;
    return dot_generic([v](int64_t j) { return v[j]; }, u, d);
  }
  const uint16_t* v = f.f16() + r * d;
  return dot_generic([v](int64_t j) { return half_to_float(v[j]); }, u, d);
}

void gather_generic(const FeatureData& f, const int64_t* rows, int64_t m, const float* u,
                    float* out) {
  for (int64_t t = 0; t < m; ++t) out[t] = score_generic_row(f, rows[t], u);
}

void totals_generic(const int8_t* V, int64_t d, int64_t r0, int64_t r1, const int16_t* uq,
                    int64_t* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const int8_t* v = V + r * d;
    int64_t total = 0;
    for (int64_t j = 0; j < d; ++j) total += static_cast<int64_t>(v[j]) * uq[j];
    out[r - r0] = total;
  }
}

void bounds_generic(const int64_t* t, int64_t nb, const double* scale, const double* dq,
                    const double* err, const double* gx, const Int8Bound& b, double* s,
                    double* e) {
  for (int64_t x = 0; x < nb; ++x) {
    const double a = static_cast<double>(t[x]) * scale[x] * b.su;
    const double v = a + b.cs;
    s[x] = v;
    e[x] = (dq[x] * b.wn + err[x] * b.unq + gx[x] * b.un) * (1.0 + 1e-9) +
           4.5e-16 * std::fabs(a) + 2.3e-16 * std::fabs(v) + b.ce + b.tiny;
  }
}

int64_t reaching_generic(const double* s, const double* e, int64_t nb, double thr,
                         int32_t* idx) {
  int64_t m = 0;
  for (int64_t x = 0; x < nb; ++x)
    if (!(s[x] + e[x] < thr)) idx[m++] = static_cast<int32_t>(x);
  return m;
}

#ifdef CROSSKNN_X86
// ---------------- AVX2 path (float32 / float16 via FMA; int8 via integer madd) --------------
__attribute__((target("avx2,fma,f16c"))) inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
__attribute__((target("avx2,fma,f16c"))) inline __m256 load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline float scalar_of(float v) { return v; }
inline float scalar_of(uint16_t v) { return half_to_float(v); }

__attribute__((target("avx2,fma,f16c"))) inline float hsum(__m256 a, __m256 b) {
  __m256 s = _mm256_add_ps(a, b);
  __m128 lo = _mm256_castps256_ps128(s), hi = _mm256_extractf128_ps(s, 1);
  __m128 x = _mm_add_ps(lo, hi);                  // 4
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));         // 2
  x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 0x55));  // 1
  return _mm_cvtss_f32(x);
}

// One row against NQ queries; per (row, query) four 8-lane accumulators (8-chunk c goes to
// accumulator c mod 4), so the operation order of one score is the same for every NQ: batch and
// single-query calls agree bit for bit. Four chains per query hide the FMA latency (int8 and
// float16 are compute-bound, float32 memory-bound).
template <int NQ, class T>
__attribute__((target("avx2,fma,f16c"))) inline void dot_tile(const T* v, const float* const* u,
                                                              int64_t d, float* s) {
  __m256 acc[NQ][4];
  _Pragma("GCC unroll 4") for (int q = 0; q < NQ; ++q) {
    acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = _mm256_setzero_ps();
  }
  int64_t j = 0;
  for (; j + 32 <= d; j += 32) {
    const __m256 x0 = load8(v + j), x1 = load8(v + j + 8), x2 = load8(v + j + 16),
                 x3 = load8(v + j + 24);
    _Pragma("GCC unroll 4") for (int q = 0; q < NQ; ++q) {
      acc[q][0] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(u[q] + j), acc[q][0]);
      acc[q][1] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(u[q] + j + 8), acc[q][1]);
      acc[q][2] = _mm256_fmadd_ps(x2, _mm256_loadu_ps(u[q] + j + 16), acc[q][2]);
      acc[q][3] = _mm256_fmadd_ps(x3, _mm256_loadu_ps(u[q] + j + 24), acc[q][3]);
    }
  }
  for (int c = 0; j + 8 <= d; j += 8, ++c) {
    const __m256 x = load8(v + j);
    _Pragma("GCC unroll 4") for (int q = 0; q < NQ; ++q) {
      acc[q][c] = _mm256_fmadd_ps(x, _mm256_loadu_ps(u[q] + j), acc[q][c]);
    }
  }
  _Pragma("GCC unroll 4") for (int q = 0; q < NQ; ++q) {
    float t = hsum(_mm256_add_ps(acc[q][0], acc[q][1]), _mm256_add_ps(acc[q][2], acc[q][3]));
    for (int64_t jj = j; jj < d; ++jj) t = t + scalar_of(v[jj]) * u[q][jj];
    s[q] = t;
  }
}

// Rows in L1-sized groups (about 16 KiB); for each pair of queries the group is swept once, so
// a pair's u vectors come from L2 once per group instead of once per row. Each row is read
// from memory once for all Q queries. Per-score operation order is that of dot_tile.
inline int64_t row_group(int64_t row_bytes) {
  return std::max<int64_t>(1, (16 << 10) / std::max<int64_t>(1, row_bytes));
}

template <class T>
__attribute__((target("avx2,fma,f16c"))) void scores_avx2_t(const T* V, int64_t d, int64_t r0,
                                                            int64_t r1, const float* U, int64_t Q,
                                                            float* out, int64_t ld) {
  float s[2];
  const int64_t G = Q > 1 ? row_group(d * static_cast<int64_t>(sizeof(T))) : 1;
  for (int64_t g0 = r0; g0 < r1; g0 += G) {
    const int64_t g1 = std::min(r1, g0 + G);
    int64_t q = 0;
    for (; q + 2 <= Q; q += 2) {
      const float* u[2] = {U + q * d, U + (q + 1) * d};
      for (int64_t r = g0; r < g1; ++r) {
        dot_tile<2>(V + r * d, u, d, s);
        out[q * ld + (r - r0)] = s[0];
        out[(q + 1) * ld + (r - r0)] = s[1];
      }
    }
    if (q < Q) {
      const float* u[1] = {U + q * d};
      for (int64_t r = g0; r < g1; ++r) {
        dot_tile<1>(V + r * d, u, d, s);
        out[q * ld + (r - r0)] = s[0];
      }
    }
  }
}

// int8 rows against int16 queries, exact integer sums (so any order gives the same result).
template <int NQ>
__attribute__((target("avx2,fma,f16c"))) inline void dot_i8(const int8_t* v,
                                                            const int16_t* const* u, int64_t d,
                                                            int64_t* total) {
  for (int q = 0; q < NQ; ++q) total[q] = 0;
  int64_t j = 0;
  while (j + 16 <= d) {
    // at most 2048 elements per int32 chunk: 128 madds of <= 2 * 127 * 32767 per lane
    const int64_t end = std::min(d, j + 2048);
    __m256i acc[NQ];
    for (int q = 0; q < NQ; ++q) acc[q] = _mm256_setzero_si256();
    for (; j + 16 <= end; j += 16) {
      const __m256i x =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + j)));
      _Pragma("GCC unroll 4") for (int q = 0; q < NQ; ++q) {
        acc[q] = _mm256_add_epi32(
            acc[q],
            _mm256_madd_epi16(x, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u[q] + j))));
      }
    }
    _Pragma("GCC unroll 4") for (int q = 0; q < NQ; ++q) {  // 8 int32 lanes -> int64
      const __m256i w =
          _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(acc[q])),
                           _mm256_cvtepi32_epi64(_mm256_extracti128_si256(acc[q], 1)));
      const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
      total[q] += _mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1);
    }
  }
  for (; j < d; ++j)
    for (int q = 0; q < NQ; ++q) total[q] += static_cast<int64_t>(v[j]) * u[q][j];
}

// two int8 rows against one int16 query (independent chains for the single-query case)
__attribute__((target("avx2,fma,f16c"))) inline void dot_i8_2rows(const int8_t* v0,
                                                                  const int8_t* v1,
                                                                  const int16_t* u, int64_t d,
                                                                  int64_t* total) {
  total[0] = total[1] = 0;
  int64_t j = 0;
  while (j + 16 <= d) {
    const int64_t end = std::min(d, j + 2048);
    __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
    for (; j + 16 <= end; j += 16) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + j));
      a0 = _mm256_add_epi32(
          a0,
          _mm256_madd_epi16(
              _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v0 + j))), w));
      a1 = _mm256_add_epi32(
          a1,
          _mm256_madd_epi16(
              _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v1 + j))), w));
    }
    const __m256i w0 = _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(a0)),
                                        _mm256_cvtepi32_epi64(_mm256_extracti128_si256(a0, 1)));
    const __m256i w1 = _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(a1)),
                                        _mm256_cvtepi32_epi64(_mm256_extracti128_si256(a1, 1)));
    const __m128i h0 = _mm_add_epi64(_mm256_castsi256_si128(w0), _mm256_extracti128_si256(w0, 1));
    const __m128i h1 = _mm_add_epi64(_mm256_castsi256_si128(w1), _mm256_extracti128_si256(w1, 1));
    total[0] += _mm_cvtsi128_si64(h0) + _mm_extract_epi64(h0, 1);
    total[1] += _mm_cvtsi128_si64(h1) + _mm_extract_epi64(h1, 1);
  }
  for (; j < d; ++j) {
    total[0] += static_cast<int64_t>(v0[j]) * u[j];
    total[1] += static_cast<int64_t>(v1[j]) * u[j];
  }
}

__attribute__((target("avx2,fma,f16c"))) void scores_avx2_i8(const FeatureData& f, int64_t r0,
                                                             int64_t r1, const Queries& qs,
                                                             float* out, int64_t ld) {
  const int64_t d = f.dim(), Q = qs.Q;
  const int8_t* V = f.i8();
  const float* scales = f.scales();
  int64_t t[2];
  const int64_t G = row_group(d);  // integer sums are exact: any grouping gives the same scores
  for (int64_t g0 = r0; g0 < r1; g0 += G) {
    const int64_t g1 = std::min(r1, g0 + G);
    int64_t q = 0;
    for (; q + 2 <= Q; q += 2) {
      const int16_t* u[2] = {qs.uq.data() + q * d, qs.uq.data() + (q + 1) * d};
      for (int64_t r = g0; r < g1; ++r) {
        dot_i8<2>(V + r * d, u, d, t);
        out[q * ld + (r - r0)] = int8_score(t[0], qs.su[q], scales[r]);
        out[(q + 1) * ld + (r - r0)] = int8_score(t[1], qs.su[q + 1], scales[r]);
      }
    }
    if (q < Q) {
      const int16_t* u[1] = {qs.uq.data() + q * d};
      int64_t r = g0;
      // short rows: two at a time hides the per-row reduction (1.3-1.7x at d = 128..200);
      // measured slower for d >= ~500, where one row at a time streams best
      for (; d <= 256 && r + 2 <= g1; r += 2) {
        dot_i8_2rows(V + r * d, V + (r + 1) * d, u[0], d, t);
        out[q * ld + (r - r0)] = int8_score(t[0], qs.su[q], scales[r]);
        out[q * ld + (r + 1 - r0)] = int8_score(t[1], qs.su[q], scales[r + 1]);
      }
      for (; r < g1; ++r) {
        dot_i8<1>(V + r * d, u, d, t);
        out[q * ld + (r - r0)] = int8_score(t[0], qs.su[q], scales[r]);
      }
    }
  }
}

// four float16 rows against one query: two 8-lane accumulators per row, j in steps of 16
// one float16 row against one query: two 8-lane accumulators, then the scalar tail
__attribute__((target("avx2,fma,f16c"))) inline float shadow_row_avx2(const uint16_t* h,
                                                                      int64_t d, const float* u) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= d; j += 16) {
      a0 = _mm256_fmadd_ps(load8(h + j), _mm256_loadu_ps(u + j), a0);
      a1 = _mm256_fmadd_ps(load8(h + j + 8), _mm256_loadu_ps(u + j + 8), a1);
    }
    float v = hsum(a0, a1);
    for (int64_t jj = j; jj < d; ++jj) v = v + half_to_float(h[jj]) * u[jj];
  return v;
}

__attribute__((target("avx2,fma,f16c"))) void shadow_avx2(const uint16_t* H, int64_t d,
                                                          int64_t r0, int64_t r1,
                                                          const float* u, float* out) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    const uint16_t* h[4] = {H + r * d, H + (r + 1) * d, H + (r + 2) * d, H + (r + 3) * d};
    __m256 a0[4], a1[4];
    for (int t = 0; t < 4; ++t) a0[t] = a1[t] = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= d; j += 16) {
      const __m256 u0 = _mm256_loadu_ps(u + j), u1 = _mm256_loadu_ps(u + j + 8);
      for (int t = 0; t < 4; ++t) {
        a0[t] = _mm256_fmadd_ps(load8(h[t] + j), u0, a0[t]);
        a1[t] = _mm256_fmadd_ps(load8(h[t] + j + 8), u1, a1[t]);
      }
    }
    for (int t = 0; t < 4; ++t) {
      float v = hsum(a0[t], a1[t]);
      for (int64_t jj = j; jj < d; ++jj) v = v + half_to_float(h[t][jj]) * u[jj];
      out[r + t - r0] = v;
    }
  }
  for (; r < r1; ++r) out[r - r0] = shadow_row_avx2(H + r * d, d, u);
}

// float16 rows given by id against one query (two 8-lane accumulators, as shadow_avx2's rows)
__attribute__((target("avx2,fma,f16c"))) void shadow_rows_avx2(const uint16_t* H, int64_t d,
                                                               const int64_t* rows, int64_t m,
                                                               const float* u, float* out) {
  for (int64_t t = 0; t < m; ++t) out[t] = shadow_row_avx2(H + rows[t] * d, d, u);
}

// one query, rows given by id: dot_tile<1> as scores_avx2_t uses it for a lone query
__attribute__((target("avx2,fma,f16c"))) void gather_avx2(const FeatureData& f,
                                                          const int64_t* rows, int64_t m,
                                                          const float* u, float* out) {
  const int64_t d = f.dim();
  const float* uu[1] = {u};
  for (int64_t t = 0; t < m; ++t) {
    if (f.storage() == Storage::Float32)
      dot_tile<1>(f.f32() + rows[t] * d, uu, d, out + t);
    else
      dot_tile<1>(f.f16() + rows[t] * d, uu, d, out + t);
  }
}

__attribute__((target("avx2,fma,f16c"))) void totals_avx2(const int8_t* V, int64_t d, int64_t r0,
                                                          int64_t r1, const int16_t* uq,
                                                          int64_t* out) {
  const int16_t* u[1] = {uq};
  int64_t r = r0;
  for (; d <= 256 && r + 2 <= r1; r += 2) dot_i8_2rows(V + r * d, V + (r + 1) * d, uq, d, out + (r - r0));
  for (; r < r1; ++r) dot_i8<1>(V + r * d, u, d, out + (r - r0));
}

// ---------------- AVX-512 (BW, VL; VNNI where present): int8 rows, exact integer sums ---------
#define CROSSKNN_AVX512_I8 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define CROSSKNN_AVX512_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

// 16 int32 lanes -> one int64 sum
CROSSKNN_AVX512_I8 inline int64_t hsum_epi32(__m512i a) {
  const __m512i w = _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(a)),
                                     _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(a, 1)));
  return _mm512_reduce_add_epi64(w);
}

// One int8 row against one int16 query: 32 entries per step, sign-extended to int16, pairs
// multiplied and added into int32 lanes (vpdpwssd with VNNI, else vpmaddwd + vpaddd), masked
// loads for the last < 32; the lanes are summed into int64 every 4096 entries. The totals are
// exact integers: the same values as every other path.
template <bool Vnni>
CROSSKNN_AVX512_VNNI inline __m512i madd_acc(__m512i acc, __m512i x, __m512i u) {
  if (Vnni) return _mm512_dpwssd_epi32(acc, x, u);
  return _mm512_add_epi32(acc, _mm512_madd_epi16(x, u));
}

template <bool Vnni>
CROSSKNN_AVX512_VNNI int64_t dot_i8_512(const int8_t* v, const int16_t* u, int64_t d) {
  int64_t total = 0;
  int64_t j = 0;
  while (j < d) {
    // <= 4096 entries per int32 chunk: each lane of the two accumulators takes <= 64 pairs of
    // products, |pair| <= 2 * 127 * 32767, so |lane| < 2^30
    const int64_t end = std::min(d, j + 4096);
    __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
    for (; j + 64 <= end; j += 64) {
      const __m512i x0 =
          _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + j)));
      const __m512i x1 =
          _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + j + 32)));
      a0 = madd_acc<Vnni>(a0, x0, _mm512_loadu_si512(u + j));
      a1 = madd_acc<Vnni>(a1, x1, _mm512_loadu_si512(u + j + 32));
    }
    for (; j < end; j += 32) {
      const int64_t left = std::min<int64_t>(32, end - j);
      const __mmask32 mk = left == 32 ? ~__mmask32(0) : ((__mmask32(1) << left) - 1u);
      const __m512i x = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mk, v + j));
      a0 = madd_acc<Vnni>(a0, x, _mm512_maskz_loadu_epi16(mk, u + j));
    }
    total += hsum_epi32(_mm512_add_epi32(a0, a1));
  }
  return total;
}

// Four rows against the query at once (d <= 4096): one load of the query's 32 entries per step
// serves the four rows, whose four chains of multiply-adds are independent (one row alone waits
// on its accumulators: on the 2-core Xeon 3,633 rows of 585 entries took 72 us one row at a time
// and 55 us four at a time, 384 entries 40 and 25 us). Each lane of a row's one accumulator takes
// <= 128 pairs of products, |lane| < 2^30: the same exact totals.
CROSSKNN_AVX512_I8 inline __m512i widen32(const int8_t* v) {
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v)));
}
CROSSKNN_AVX512_I8 inline __m512i widen32(__mmask32 mk, const int8_t* v) {
  return _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mk, v));
}

template <bool Vnni>
CROSSKNN_AVX512_VNNI void dot4_i8_512(const int8_t* v0, int64_t d, const int16_t* u,
                                      int64_t* out) {
  const int8_t* v1 = v0 + d;
  const int8_t* v2 = v1 + d;
  const int8_t* v3 = v2 + d;
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  int64_t j = 0;
  // the next group of four rows, a line of each per 64 entries: the copy streams from L3 when
  // a round's other work has left the core's L2 (prefetching never faults past the end)
  const char* nx = reinterpret_cast<const char*>(v0 + 4 * d);
  for (; j + 32 <= d; j += 32) {
    if ((j & 63) == 0) {
      _mm_prefetch(nx + j, _MM_HINT_T0);
      _mm_prefetch(nx + d + j, _MM_HINT_T0);
      _mm_prefetch(nx + 2 * d + j, _MM_HINT_T0);
      _mm_prefetch(nx + 3 * d + j, _MM_HINT_T0);
    }
    const __m512i uu = _mm512_loadu_si512(u + j);
    a0 = madd_acc<Vnni>(a0, widen32(v0 + j), uu);
    a1 = madd_acc<Vnni>(a1, widen32(v1 + j), uu);
    a2 = madd_acc<Vnni>(a2, widen32(v2 + j), uu);
    a3 = madd_acc<Vnni>(a3, widen32(v3 + j), uu);
  }
  if (j < d) {
    const __mmask32 mk = (__mmask32(1) << (d - j)) - 1u;
    const __m512i uu = _mm512_maskz_loadu_epi16(mk, u + j);
    a0 = madd_acc<Vnni>(a0, widen32(mk, v0 + j), uu);
    a1 = madd_acc<Vnni>(a1, widen32(mk, v1 + j), uu);
    a2 = madd_acc<Vnni>(a2, widen32(mk, v2 + j), uu);
    a3 = madd_acc<Vnni>(a3, widen32(mk, v3 + j), uu);
  }
  out[0] = hsum_epi32(a0);
  out[1] = hsum_epi32(a1);
  out[2] = hsum_epi32(a2);
  out[3] = hsum_epi32(a3);
}

template <bool Vnni>
CROSSKNN_AVX512_VNNI void totals_avx512_t(const int8_t* V, int64_t d, int64_t r0, int64_t r1,
                                          const int16_t* uq, int64_t* out) {
  int64_t r = r0;
  if (d <= 4096)
    for (; r + 4 <= r1; r += 4) dot4_i8_512<Vnni>(V + r * d, d, uq, out + (r - r0));
  for (; r < r1; ++r) out[r - r0] = dot_i8_512<Vnni>(V + r * d, uq, d);
}
void totals_avx512(const int8_t* V, int64_t d, int64_t r0, int64_t r1, const int16_t* uq,
                   int64_t* out) {
  totals_avx512_t<false>(V, d, r0, r1, uq, out);
}
void totals_avx512_vnni(const int8_t* V, int64_t d, int64_t r0, int64_t r1, const int16_t* uq,
                        int64_t* out) {
  totals_avx512_t<true>(V, d, r0, r1, uq, out);
}

// int8_bounds eight rows at a time: the generic path's operations lane for lane (the core
// builds with -ffp-contract=off: no fused multiply-adds), so the same bits.
CROSSKNN_AVX512_I8 void bounds_avx512(const int64_t* t, int64_t nb, const double* scale,
                                      const double* dq, const double* err, const double* gx,
                                      const Int8Bound& b, double* s, double* e) {
  const __m512d su = _mm512_set1_pd(b.su), cs = _mm512_set1_pd(b.cs), wn = _mm512_set1_pd(b.wn),
                unq = _mm512_set1_pd(b.unq), un = _mm512_set1_pd(b.un),
                safety = _mm512_set1_pd(1.0 + 1e-9), ka = _mm512_set1_pd(4.5e-16),
                kv = _mm512_set1_pd(2.3e-16), ce = _mm512_set1_pd(b.ce),
                tiny = _mm512_set1_pd(b.tiny);
  int64_t x = 0;
  for (; x + 8 <= nb; x += 8) {
    const __m512d tt = _mm512_cvtepi64_pd(_mm512_loadu_si512(t + x));
    const __m512d a = _mm512_mul_pd(_mm512_mul_pd(tt, _mm512_loadu_pd(scale + x)), su);
    const __m512d v = _mm512_add_pd(a, cs);
    __m512d r = _mm512_add_pd(
        _mm512_add_pd(_mm512_mul_pd(_mm512_loadu_pd(dq + x), wn),
                      _mm512_mul_pd(_mm512_loadu_pd(err + x), unq)),
        _mm512_mul_pd(_mm512_loadu_pd(gx + x), un));
    r = _mm512_add_pd(_mm512_mul_pd(r, safety), _mm512_mul_pd(ka, _mm512_abs_pd(a)));
    r = _mm512_add_pd(_mm512_add_pd(_mm512_add_pd(r, _mm512_mul_pd(kv, _mm512_abs_pd(v))), ce),
                      tiny);
    _mm512_storeu_pd(s + x, v);
    _mm512_storeu_pd(e + x, r);
  }
  if (x < nb) bounds_generic(t + x, nb - x, scale + x, dq + x, err + x, gx + x, b, s + x, e + x);
}

CROSSKNN_AVX512_I8 int64_t reaching_avx512(const double* s, const double* e, int64_t nb,
                                           double thr, int32_t* idx) {
  const __m512d th = _mm512_set1_pd(thr);
  int64_t m = 0, x = 0;
  for (; x + 8 <= nb; x += 8) {
    const __m512d hi = _mm512_add_pd(_mm512_loadu_pd(s + x), _mm512_loadu_pd(e + x));
    // not (hi < thr): NaN bounds reach it too, as in the generic path
    unsigned mk = _mm512_cmp_pd_mask(hi, th, _CMP_NLT_UQ);
    while (mk) {
      idx[m++] = static_cast<int32_t>(x + __builtin_ctz(mk));
      mk &= mk - 1;
    }
  }
  for (; x < nb; ++x)
    if (!(s[x] + e[x] < thr)) idx[m++] = static_cast<int32_t>(x);
  return m;
}

// float16 rows against one query for the prefilter (any order within its error bound): four
// rows at a time, two 16-lane accumulators per row, 32 entries per step, masked loads for the
// last < 32 (zeros add nothing); per score at most d / 32 + 2 FMAs and 5 adds per path.
CROSSKNN_AVX512_I8 inline void shadow4_avx512(const uint16_t* const* h, int nr, int64_t d,
                                              const float* u, float* out) {
  __m512 a0[4], a1[4];
  for (int t = 0; t < 4; ++t) a0[t] = a1[t] = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 32 <= d; j += 32) {
    const __m512 u0 = _mm512_loadu_ps(u + j), u1 = _mm512_loadu_ps(u + j + 16);
    for (int t = 0; t < nr; ++t) {
      a0[t] = _mm512_fmadd_ps(
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h[t] + j))), u0,
          a0[t]);
      a1[t] = _mm512_fmadd_ps(
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h[t] + j + 16))),
          u1, a1[t]);
    }
  }
  for (; j < d; j += 16) {
    const int64_t left = std::min<int64_t>(16, d - j);
    const __mmask16 mk = static_cast<__mmask16>((1u << left) - 1u);
    const __m512 uj = _mm512_maskz_loadu_ps(mk, u + j);
    for (int t = 0; t < nr; ++t)
      a0[t] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, h[t] + j)), uj, a0[t]);
  }
  for (int t = 0; t < nr; ++t) out[t] = _mm512_reduce_add_ps(_mm512_add_ps(a0[t], a1[t]));
}

CROSSKNN_AVX512_I8 void shadow_avx512(const uint16_t* H, int64_t d, int64_t r0, int64_t r1,
                                      const float* u, float* out) {
  const uint16_t* h[4];
  for (int64_t r = r0; r < r1; r += 4) {
    const int nr = static_cast<int>(std::min<int64_t>(4, r1 - r));
    for (int t = 0; t < nr; ++t) h[t] = H + (r + t) * d;
    shadow4_avx512(h, nr, d, u, out + (r - r0));
  }
}

CROSSKNN_AVX512_I8 void shadow_rows_avx512(const uint16_t* H, int64_t d, const int64_t* rows,
                                           int64_t m, const float* u, float* out) {
  const uint16_t* h[4];
  for (int64_t t0 = 0; t0 < m; t0 += 4) {
    const int nr = static_cast<int>(std::min<int64_t>(4, m - t0));
    for (int t = 0; t < nr; ++t) h[t] = H + rows[t0 + t] * d;
    shadow4_avx512(h, nr, d, u, out + t0);
  }
}

// Exact scores of rows given by id, two rows at a time (two memory streams in flight), each
// with dot_tile<1>'s operations: its accumulators 0 | 1 and 2 | 3 are the halves of two 16-lane
// registers (lane for lane the same FMAs), then the same 8-entry steps, reduction and tail.
CROSSKNN_AVX512_I8 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
CROSSKNN_AVX512_I8 inline __m512 load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

template <int NR, class T>
CROSSKNN_AVX512_I8 inline void exact_rows_avx512(const T* const* v, const float* u, int64_t d,
                                                 float* out) {
  __m512 z01[NR], z23[NR];
  for (int r = 0; r < NR; ++r) z01[r] = z23[r] = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 32 <= d; j += 32) {
    const __m512 u0 = _mm512_loadu_ps(u + j), u1 = _mm512_loadu_ps(u + j + 16);
    for (int r = 0; r < NR; ++r) {
      z01[r] = _mm512_fmadd_ps(load16(v[r] + j), u0, z01[r]);
      z23[r] = _mm512_fmadd_ps(load16(v[r] + j + 16), u1, z23[r]);
    }
  }
  for (int r = 0; r < NR; ++r) {
    __m256 acc[4] = {_mm512_castps512_ps256(z01[r]), _mm512_extractf32x8_ps(z01[r], 1),
                     _mm512_castps512_ps256(z23[r]), _mm512_extractf32x8_ps(z23[r], 1)};
    int64_t jj = j;
    for (int c = 0; jj + 8 <= d; jj += 8, ++c)
      acc[c] = _mm256_fmadd_ps(load8(v[r] + jj), _mm256_loadu_ps(u + jj), acc[c]);
    float t = hsum(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    for (; jj < d; ++jj) t = t + scalar_of(v[r][jj]) * u[jj];
    out[r] = t;
  }
}

template <class T>
CROSSKNN_AVX512_I8 void gather_avx512_t(const T* V, int64_t d, const int64_t* rows, int64_t m,
                                        const float* u, float* out) {
  int64_t t = 0;
  for (; t + 2 <= m; t += 2) {
    const T* v[2] = {V + rows[t] * d, V + rows[t + 1] * d};
    exact_rows_avx512<2>(v, u, d, out + t);
  }
  if (t < m) {
    const T* v[1] = {V + rows[t] * d};
    exact_rows_avx512<1>(v, u, d, out + t);
  }
}

void gather_avx512(const FeatureData& f, const int64_t* rows, int64_t m, const float* u,
                   float* out) {
  if (f.storage() == Storage::Float32)
    gather_avx512_t(f.f32(), f.dim(), rows, m, u, out);
  else
    gather_avx512_t(f.f16(), f.dim(), rows, m, u, out);
}

void scores_avx2(const FeatureData& f, int64_t r0, int64_t r1, const Queries& qs, float* out,
                 int64_t ld) {
  switch (f.storage()) {
    case Storage::Float32:
      return scores_avx2_t(f.f32(), f.dim(), r0, r1, qs.U, qs.Q, out, ld);
    case Storage::Float16:
      return scores_avx2_t(f.f16(), f.dim(), r0, r1, qs.U, qs.Q, out, ld);
    default:
      return scores_avx2_i8(f, r0, r1, qs, out, ld);
  }
}
#endif

using ScoreFn = void (*)(const FeatureData&, int64_t, int64_t, const Queries&, float*, int64_t);
using GatherFn = void (*)(const FeatureData&, const int64_t*, int64_t, const float*, float*);
using TotalsFn = void (*)(const int8_t*, int64_t, int64_t, int64_t, const int16_t*, int64_t*);
using ShadowFn = void (*)(const uint16_t*, int64_t, int64_t, int64_t, const float*, float*);
using BoundsFn = void (*)(const int64_t*, int64_t, const double*, const double*, const double*,
                          const double*, const Int8Bound&, double*, double*);
using ReachingFn = int64_t (*)(const double*, const double*, int64_t, double, int32_t*);
using ShadowRowsFn = void (*)(const uint16_t*, int64_t, const int64_t*, int64_t, const float*,
                              float*);

void shadow_rows_generic(const uint16_t* H, int64_t d, const int64_t* rows, int64_t m,
                         const float* u, float* out) {
  for (int64_t t = 0; t < m; ++t) {
    const uint16_t* h = H + rows[t] * d;
    out[t] = dot_generic([h](int64_t j) { return half_to_float(h[j]); }, u, d);
  }
}

void shadow_generic(const uint16_t* H, int64_t d, int64_t r0, int64_t r1, const float* u,
                    float* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint16_t* h = H + r * d;
    out[r - r0] = dot_generic([h](int64_t j) { return half_to_float(h[j]); }, u, d);
  }
}

struct Dispatch {
  ScoreFn fn = scores_generic;
  GatherFn gather = gather_generic;
  TotalsFn totals = totals_generic;
  ShadowFn shadow = shadow_generic;
  ShadowRowsFn shadow_rows = shadow_rows_generic;
  BoundsFn bounds = bounds_generic;
  ReachingFn reaching = reaching_generic;
  const char* name = "generic";
  Dispatch() {
#ifdef CROSSKNN_X86
    const SimdLevel level = simd_level();
    if (level >= SimdLevel::Avx2) {
      fn = scores_avx2;
      gather = gather_avx2;
      totals = totals_avx2;
      shadow = shadow_avx2;
      shadow_rows = shadow_rows_avx2;
      name = "avx2";
    }
    if (level >= SimdLevel::Avx512) {
      totals = __builtin_cpu_supports("avx512vnni") ? totals_avx512_vnni : totals_avx512;
      bounds = bounds_avx512;
      reaching = reaching_avx512;
      shadow = shadow_avx512;
      shadow_rows = shadow_rows_avx512;
      gather = gather_avx512;
      name = "avx512";
    }
#endif
  }
};

SimdLevel detect_level() {
  if (simd_disabled()) return SimdLevel::Generic;
  const char* want = std::getenv("CROSSKNN_SIMD");  // generic | avx2 | avx512 (the default)
#ifdef CROSSKNN_X86
  __builtin_cpu_init();
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")))
    return SimdLevel::Generic;
  if (want && std::strcmp(want, "avx2") == 0) return SimdLevel::Avx2;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return SimdLevel::Avx512;
  return SimdLevel::Avx2;
#else
  return SimdLevel::Generic;
#endif
}

const Dispatch& dispatch() {
  static const Dispatch d;
  return d;
}

}  // namespace

Queries prepare_queries(const FeatureData& f, const float* U, int64_t Q) {
  Queries qs;
  qs.U = U;
  qs.Q = Q;
  qs.d = f.dim();
  if (f.storage() == Storage::Int8) {
    const int64_t d = f.dim();
    qs.uq.resize(static_cast<size_t>(Q * d));
    qs.su.resize(static_cast<size_t>(Q));
    for (int64_t q = 0; q < Q; ++q) {
      const float* u = U + q * d;
      double mx = 0.0;
      for (int64_t j = 0; j < d; ++j) mx = std::max(mx, std::fabs(static_cast<double>(u[j])));
      const double su = mx > 0.0 ? mx / 32767.0 : 1.0;
      qs.su[q] = su;
      for (int64_t j = 0; j < d; ++j) {
        const double x = std::nearbyint(static_cast<double>(u[j]) / su);
        qs.uq[q * d + j] = static_cast<int16_t>(std::min(32767.0, std::max(-32767.0, x)));
      }
    }
  }
  return qs;
}

void block_scores(const FeatureData& f, int64_t r0, int64_t r1, const Queries& qs, float* out,
                  int64_t ld) {
  dispatch().fn(f, r0, r1, qs, out, ld);
}

void gather_scores(const FeatureData& f, const int64_t* rows, int64_t m, const float* u,
                   float* out) {
  dispatch().gather(f, rows, m, u, out);
}

void int8_totals(const int8_t* V, int64_t d, int64_t r0, int64_t r1, const int16_t* uq,
                 int64_t* out) {
  dispatch().totals(V, d, r0, r1, uq, out);
}

void int8_bounds(const int64_t* t, int64_t nb, const double* scale, const double* dq,
                 const double* err, const double* gx, const Int8Bound& b, double* s, double* e) {
  dispatch().bounds(t, nb, scale, dq, err, gx, b, s, e);
}

int64_t rows_reaching(const double* s, const double* e, int64_t nb, double thr, int32_t* idx) {
  return dispatch().reaching(s, e, nb, thr, idx);
}

void shadow_scores(const uint16_t* H, int64_t d, int64_t r0, int64_t r1, const float* u,
                   float* out) {
  dispatch().shadow(H, d, r0, r1, u, out);
}

void shadow_rows(const uint16_t* H, int64_t d, const int64_t* rows, int64_t m, const float* u,
                 float* out) {
  dispatch().shadow_rows(H, d, rows, m, u, out);
}

const char* kernel_name() noexcept { return dispatch().name; }

bool simd_disabled() noexcept {
  static const bool off = [] {
    const char* env = std::getenv("CROSSKNN_NO_SIMD");
    const char* want = std::getenv("CROSSKNN_SIMD");
    return (env && *env && std::strcmp(env, "0") != 0) ||
           (want && std::strcmp(want, "generic") == 0);
  }();
  return off;
}

SimdLevel simd_level() noexcept {
  static const SimdLevel level = detect_level();
  return level;
}

void parallel_for(int threads, int64_t n_tasks, const std::function<void(int, int64_t)>& body) {
  if (n_tasks <= 0) return;
  const int T = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n_tasks)));
  if (T == 1) {
    for (int64_t t = 0; t < n_tasks; ++t) body(0, t);
    return;
  }
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&](int w) {
    try {
      for (;;) {
        if (failed.load(std::memory_order_relaxed)) return;
        const int64_t t = next.fetch_add(1);
        if (t >= n_tasks) return;
        body(w, t);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
      failed = true;
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(T - 1);
  try {
    for (int w = 1; w < T; ++w) pool.emplace_back(work, w);
  } catch (...) {
    // could not start another thread: the ones already running and worker 0 do the work
  }
  work(0);
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace crossknn::detail

const char* crossknn::kernel_name() noexcept { return detail::kernel_name(); }
