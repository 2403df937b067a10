// The solvers' grouped kernels (cpp/src/dots.h) give the bits of the one-at-a-time operations
// they replace: multi-dots vs single dots in both reduction orders, float32 loads vs the same
// values as doubles, the register-tiled X^T X and Cholesky updates vs plain loops in entry order.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "../src/dots.h"
#include "check.h"

using crossknn::detail::DotOrder;

namespace {

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

double plain_dot(DotOrder o, const double* a, const double* b, int64_t n) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) s[l] += a[j + l] * b[j + l];
  for (; j < n; ++j) s[0] += a[j] * b[j];
  if (o == DotOrder::Interleaved)
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void test_dots() {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> g(0.f, 1.f);
  for (int64_t n : {0, 1, 7, 8, 9, 31, 384, 1677}) {
    std::vector<float> fa(4 * n), fb(n);
    for (auto& x : fa) x = g(rng) * 3.f;
    for (auto& x : fb) x = g(rng);
    std::vector<double> da(fa.begin(), fa.end()), db(fb.begin(), fb.end());
    for (DotOrder o : {DotOrder::Interleaved, DotOrder::Pairwise}) {
      for (int na = 1; na <= 4; ++na) {
        const double* a[4] = {da.data(), da.data() + n, da.data() + 2 * n, da.data() + 3 * n};
        const float* af[4] = {fa.data(), fa.data() + n, fa.data() + 2 * n, fa.data() + 3 * n};
        double out[4], outf[4];
        crossknn::detail::dots(o, a, na, db.data(), n, out);
        crossknn::detail::dots_f(o, af, na, fb.data(), n, outf);
        for (int t = 0; t < na; ++t) {
          const double want = plain_dot(o, a[t], db.data(), n);
          CHECK(same_bits(out[t], want));
          CHECK(same_bits(outf[t], want));
          CHECK(same_bits(crossknn::detail::dot1(o, a[t], db.data(), n), want));
        }
        // two vectors at once (PriorRidge's K rows): each the plain dot's bits; b1 holds
        // doubles that are no floats (the multiply-then-add path, not an exact product)
        std::vector<double> db1(db);
        for (auto& x : db1) x = x * 1.1 + 1e-3;
        double o0[4] = {-7, -7, -7, -7}, o1[4] = {-7, -7, -7, -7};
        crossknn::detail::dots2v(o, a, na, db.data(), db1.data(), n, o0, o1);
        for (int t = 0; t < na; ++t) {
          CHECK(same_bits(o0[t], plain_dot(o, a[t], db.data(), n)));
          CHECK(same_bits(o1[t], plain_dot(o, a[t], db1.data(), n)));
        }
        for (int t = na; t < 4; ++t) CHECK(o0[t] == -7.0 && o1[t] == -7.0);
      }
    }
  }
}

// Gram entries of float32 rows (blocks of rows against all earlier rows) vs one plain dot each;
// entries at j >= i or j >= j1 are left as they were
void test_gram_rows() {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> g(0.f, 1.f);
  for (int64_t n : {0, 1, 7, 8, 9, 255, 256, 257, 384, 1677}) {
    const int64_t m = 41, ld = n + 3;
    std::vector<float> X(m * ld);
    for (auto& x : X) x = g(rng) * 2.f;
    X[3 * ld] = 0.f;
    if (n > 2) X[5 * ld + 2] = -0.f;
    std::vector<double> Xd(X.begin(), X.end());
    for (DotOrder o : {DotOrder::Interleaved, DotOrder::Pairwise}) {
      for (auto [i0, i1, j1] : {std::tuple<int64_t, int64_t, int64_t>{0, 41, 40}, {7, 11, 7},
                                {20, 41, 40}, {3, 37, 12}, {40, 41, 40}, {9, 26, 25}}) {
        const int64_t ldo = m + 1;
        std::vector<double> out((i1 - i0) * ldo, -7.0);
        crossknn::detail::gram_rows_f(o, X.data(), ld, n, i0, i1, j1, out.data(), ldo);
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t j = 0; j < ldo; ++j) {
            const double got = out[(i - i0) * ldo + j];
            if (j < std::min(j1, i))
              CHECK(same_bits(got, plain_dot(o, Xd.data() + i * ld, Xd.data() + j * ld, n)));
            else
              CHECK(got == -7.0);
          }
      }
    }
  }
}

void test_tiles() {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> g(0.0, 1.0);
  for (int64_t d : {3, 4, 13, 40, 67, 131}) {
    const int64_t m = 29;
    std::vector<double> X(m * d);  // float values, as the solver's rows
    for (auto& x : X) x = static_cast<float>(g(rng));
    for (int64_t t = 0; t < m; t += 5) X[t * d + (t % d)] = 0.0;  // zeros are skipped below
    // X^T X, upper triangle, entries in t order, zero products skipped (as the axpy loop)
    std::vector<double> want(d * d, 0.0), got(d * d, 0.0);
    for (int64_t t = 0; t < m; ++t)
      for (int64_t i = 0; i < d; ++i)
        if (X[t * d + i] != 0.0)
          for (int64_t j = i; j < d; ++j) want[i * d + j] += X[t * d + i] * X[t * d + j];
    const int64_t rows = crossknn::detail::gram_tiles(X.data(), m, d, got.data());
    CHECK(rows % 4 == 0 && rows <= d);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = i; j < d; ++j) CHECK(same_bits(got[i * d + j], want[i * d + j]));
    std::vector<double> got3(d * d, 0.0);  // on three threads: the same bits
    CHECK(crossknn::detail::gram_tiles(X.data(), m, d, got3.data(), 3) == rows);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = i; j < d; ++j) CHECK(same_bits(got3[i * d + j], want[i * d + j]));
    // one block of Cholesky updates from the finished rows k < i0
    const int64_t i0 = d >= 8 ? 4 : 0;
    std::vector<double> R(d * d), R2;
    for (auto& x : R) x = g(rng);
    R[1 * d + 5 % d] = 0.0;
    R2 = R;
    if (crossknn::detail::chol_block_update(R.data(), d, i0, R.data())) {
      for (int64_t k = 0; k < i0; ++k)
        for (int64_t i = i0; i < i0 + 4; ++i)
          if (R2[k * d + i] != 0.0)
            for (int64_t j = i; j < d; ++j) R2[i * d + j] += -R2[k * d + i] * R2[k * d + j];
      for (int64_t i = i0; i < i0 + 4; ++i)
        for (int64_t j = i; j < d; ++j) CHECK(same_bits(R[i * d + j], R2[i * d + j]));
    }
  }
}

}  // namespace

int main() {
  test_dots();
  test_gram_rows();
  test_tiles();
  std::printf("dots: %d failures\n", failures);
  return failures != 0;
}
