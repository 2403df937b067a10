// The top-k prefilter (cpp/src/features.cpp): the float16 narrowing of wide int8 candidate sets
// (near-duplicate rows that the int8 copy cannot separate but the float16 copy can) and the
// int8 copy's exact constant columns; the results equal the full float32 pass (ids and float
// bits) and the intended path ran.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "../src/features_impl.h"
#include "../src/kernels.h"
#include "check.h"
#include "crossknn/features.h"

using crossknn::ExcludeLists;
using crossknn::Features;
using crossknn::Storage;

// Constant columns (a bias column of ones, another constant) with large query weights: they
// enter the int8 copy's scores exactly, so the int8 bound stays tight (no fall-back to a full
// float16 pass); the results equal the full pass.
void test_constant_columns() {
  const int64_t n = 3000, d = 61, k = 20, Q = 2;
  std::mt19937_64 rng(23);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> V(n * d), U(Q * d);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < d; ++j) V[r * d + j] = g(rng);
    V[r * d + 7] = 0.37f;
    V[r * d + d - 1] = 1.f;
  }
  Features on(V.data(), n, d, Storage::Float32, 1), off(V.data(), n, d, Storage::Float32, 1);
  off.set_prefilter(false);
  std::vector<float> s1(Q * k), s2(Q * k);
  std::vector<int64_t> i1(Q * k), i2(Q * k);
  for (int rep = 0; rep < 5; ++rep) {
    for (auto& x : U) x = g(rng) * 0.2f;
    for (int64_t q = 0; q < Q; ++q) {
      U[q * d + d - 1] = 40.f + 10.f * static_cast<float>(rep);
      U[q * d + 7] = -25.f;
    }
    on.top_k(U.data(), Q, k, ExcludeLists{}, s1.data(), i1.data());
    off.top_k(U.data(), Q, k, ExcludeLists{}, s2.data(), i2.data());
    CHECK(i1 == i2);
    CHECK(std::memcmp(s1.data(), s2.data(), s1.size() * sizeof(float)) == 0);
  }
  const auto& fd = crossknn::detail::data(on);
  std::printf("constant columns: int8 misses %d\n", fd.int8_misses.load());
  CHECK(fd.int8_misses.load() == 0);
}

// The int8 copy's integer totals (kernels.cpp, four rows at a time where d <= 4096, one at a
// time otherwise and for the last rows of a block) equal the plain sum, at extreme values
// (|x| = 127, |u| = 32767: the int32 lanes' worst case) and at odd widths and row ranges.
void test_int8_totals() {
  std::mt19937_64 rng(5);
  for (int64_t d : {1, 31, 32, 33, 63, 64, 65, 585, 4095, 4096, 4097, 9000}) {
    const int64_t n = 11;
    std::vector<int8_t> V(n * d);
    std::vector<int16_t> u(d);
    for (int extreme = 0; extreme < 2; ++extreme) {
      for (auto& x : V) x = extreme ? int8_t(127) : int8_t(static_cast<int>(rng() % 255) - 127);
      for (auto& x : u)
        x = extreme ? int16_t(32767) : int16_t(static_cast<int>(rng() % 65535) - 32767);
      for (int64_t r0 : {0, 1, 3}) {
        std::vector<int64_t> got(n - r0);
        crossknn::detail::int8_totals(V.data(), d, r0, n, u.data(), got.data());
        for (int64_t r = r0; r < n; ++r) {
          int64_t want = 0;
          for (int64_t j = 0; j < d; ++j) want += int64_t(V[r * d + j]) * u[j];
          CHECK(got[r - r0] == want);
        }
      }
    }
  }
  std::printf("int8 totals: equal to the plain sums (%s)\n", crossknn::kernel_name());
}

// The bounds of a block and the threshold test (eight rows at a time where the CPU has AVX-512)
// against the formula written out one row at a time: the same bits, every length's tail, and
// NaN bounds reach any threshold (nothing is dropped that the scalar test would keep).
void test_int8_bounds() {
  std::mt19937_64 rng(9);
  std::normal_distribution<double> g(0.0, 1.0);
  for (int64_t nb : {1, 7, 8, 9, 64, 448, 453}) {
    std::vector<int64_t> t(nb);
    std::vector<double> scale(nb), dq(nb), err(nb), gx(nb), s(nb), e(nb);
    for (int64_t x = 0; x < nb; ++x) {
      t[x] = static_cast<int64_t>(rng() % 4000000001ULL) - 2000000000;
      scale[x] = std::fabs(g(rng)) * 1e-2;
      dq[x] = std::fabs(g(rng)) * 10;
      err[x] = std::fabs(g(rng)) * 0.1;
      gx[x] = std::fabs(g(rng)) * 1e-6;
    }
    const crossknn::detail::Int8Bound b{3.1e-6, 0.25, 1e-9, 2.5, 2.6, 1e-17, 1e-40};
    crossknn::detail::int8_bounds(t.data(), nb, scale.data(), dq.data(), err.data(), gx.data(), b,
                                  s.data(), e.data());
    for (int64_t x = 0; x < nb; ++x) {
      const double a = static_cast<double>(t[x]) * scale[x] * b.su;
      const double v = a + b.cs;
      const double want = (dq[x] * b.wn + err[x] * b.unq + gx[x] * b.un) * (1.0 + 1e-9) +
                          4.5e-16 * std::fabs(a) + 2.3e-16 * std::fabs(v) + b.ce + b.tiny;
      CHECK(std::memcmp(&s[x], &v, sizeof v) == 0);
      CHECK(std::memcmp(&e[x], &want, sizeof want) == 0);
    }
    if (nb > 3) e[3] = std::nan("");
    for (double thr : {-HUGE_VAL, 0.0, 0.2, 0.3, HUGE_VAL}) {
      std::vector<int32_t> idx(nb);
      const int64_t m = crossknn::detail::rows_reaching(s.data(), e.data(), nb, thr, idx.data());
      std::vector<int32_t> want;
      for (int64_t x = 0; x < nb; ++x)
        if (!(s[x] + e[x] < thr)) want.push_back(static_cast<int32_t>(x));
      CHECK(m == static_cast<int64_t>(want.size()));
      CHECK(std::equal(want.begin(), want.end(), idx.begin()));
    }
  }
  std::printf("int8 bounds: the formula's bits, threshold test as one row at a time (%s)\n",
              crossknn::kernel_name());
}

// Features::rows as float32 equals the double rows for every storage (the values are floats)
void test_rows_float() {
  const int64_t n = 50, d = 37;
  std::mt19937_64 rng(4);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> V(n * d);
  for (auto& x : V) x = g(rng);
  const std::vector<int64_t> items = {0, 49, 7, 7, 23};
  const int64_t m = static_cast<int64_t>(items.size());
  for (Storage st : {Storage::Float32, Storage::Float16, Storage::Int8}) {
    Features f(V.data(), n, d, st, 1);
    std::vector<double> rd(m * d);
    std::vector<float> rf(m * d);
    f.rows(items.data(), m, rd.data());
    f.rows(items.data(), m, rf.data());
    for (int64_t i = 0; i < m * d; ++i) CHECK(static_cast<double>(rf[i]) == rd[i]);
  }
  std::printf("rows as float32: the double rows' values for float32, float16 and int8\n");
}

int main(int argc, char** argv) {
  test_int8_totals();
  test_int8_bounds();
  test_rows_float();
  test_constant_columns();
  const double rel = argc > 1 ? std::atof(argv[1]) : 2e-3;
  const int64_t n = 4000, d = 96, k = 20, Q = 3;
  std::mt19937_64 rng(17);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> V(n * d), U(Q * d);
  for (auto& x : V) x = g(rng);
  for (auto& x : U) x = g(rng);
  // 600 rows near each query direction (scaled up so they lead), spread by `rel`
  for (int64_t r = 0; r < 1800; ++r) {
    const float* u = U.data() + (r % Q) * d;
    for (int64_t j = 0; j < d; ++j) V[r * 2 * d + j] = 3.f * u[j] + static_cast<float>(rel) * g(rng);
  }
  Features on(V.data(), n, d, Storage::Float32, 1), off(V.data(), n, d, Storage::Float32, 1);
  off.set_prefilter(false);
  std::vector<float> s1(Q * k), s2(Q * k);
  std::vector<int64_t> i1(Q * k), i2(Q * k);
  for (int rep = 0; rep < 4; ++rep) {  // the prefilter starts at the second call
    for (auto& x : U) x += 0.01f * g(rng);
    on.top_k(U.data(), Q, k, ExcludeLists{}, s1.data(), i1.data());
    off.top_k(U.data(), Q, k, ExcludeLists{}, s2.data(), i2.data());
    CHECK(i1 == i2);
    CHECK(std::memcmp(s1.data(), s2.data(), s1.size() * sizeof(float)) == 0);
  }
  const auto& fd = crossknn::detail::data(on);
  std::printf("prefilter: narrowed %lld queries, int8 misses %d, %d failures\n",
              static_cast<long long>(fd.narrowed.load()), fd.int8_misses.load(), failures);
  CHECK(fd.narrowed.load() > 0);
  CHECK(fd.int8_misses.load() == 0);
  return failures != 0;
}
