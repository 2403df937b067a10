// ctest executable for the C++ core (no Python): storage, top-k, sampling, least squares,
// errors. Exit code 0 on success; each failed check prints a line.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "crossknn/features.h"
#include "crossknn/least_squares.h"
#include "check.h"

using namespace crossknn;

static void test_top_k(Storage st) {
  const int64_t n = 20000, d = 37, Q = 3, k = 25;
  auto V = randn(n * d, 1);
  for (int64_t j = 0; j < d; ++j) V[5 * d + j] = V[9 * d + j];  // a tie
  auto U = randn(Q * d, 2);
  std::vector<int64_t> ids = {9, 17, 17, -1, 100}, off = {0, 5, 5, 5};
  ExcludeLists ex{ids.data(), off.data()};
  std::vector<std::vector<float>> s(3, std::vector<float>(Q * k));
  std::vector<std::vector<int64_t>> idx(3, std::vector<int64_t>(Q * k));
  for (int t = 1; t <= 3; ++t) {
    Features f(V.data(), n, d, st, t);
    f.top_k(U.data(), Q, k, ex, s[t - 1].data(), idx[t - 1].data());
  }
  CHECK(s[0] == s[1] && s[0] == s[2] && idx[0] == idx[1] && idx[0] == idx[2]);
  // brute force on the dequantized rows, in double
  Features f(V.data(), n, d, st, 2);
  std::vector<int64_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  std::vector<double> rows(n * d);
  f.rows(all.data(), n, rows.data());
  for (int64_t q = 0; q < Q; ++q) {
    std::vector<std::pair<double, int64_t>> sc;
    for (int64_t i = 0; i < n; ++i) {
      if (q == 0 && (i == 9 || i == 17 || i == 100)) continue;
      double acc = 0;
      for (int64_t j = 0; j < d; ++j) acc += rows[i * d + j] * U[q * d + j];
      sc.push_back({-acc, i});
    }
    std::sort(sc.begin(), sc.end());
    const double tol = 1e-4 * (1 + std::fabs(sc[0].first));
    for (int64_t t = 0; t < k; ++t) {
      CHECK(std::fabs(s[0][q * k + t] + sc[t].first) <= tol);
      if (t + 1 < k) CHECK(s[0][q * k + t] >= s[0][q * k + t + 1]);
    }
    CHECK(std::fabs(-sc[k - 1].first - s[0][q * k + k - 1]) <= tol);
    for (int64_t t = 0; t < k; ++t) {
      const int64_t i = idx[0][q * k + t];
      if (q == 0) CHECK(i != 9 && i != 17 && i != 100);
    }
  }
}

static void test_sampling() {
  const int64_t n = 5000, d = 8;
  auto V = randn(n * d, 3);
  auto U = randn(2 * d, 4);
  Features f1(V.data(), n, d, Storage::Float32, 1), f2(V.data(), n, d, Storage::Float32, 2);
  std::vector<int64_t> ids = {0, 1, 2, 3}, off = {0, 4, 4};
  ExcludeLists ex{ids.data(), off.data()};
  std::vector<float> k1(2 * 50), k2(2 * 50);
  std::vector<int64_t> i1(2 * 50), i2(2 * 50);
  f1.sample_softmax(U.data(), 2, 50, ex, 0.5, 42, k1.data(), i1.data());
  f2.sample_softmax(U.data(), 2, 50, ex, 0.5, 42, k2.data(), i2.data());
  CHECK(k1 == k2 && i1 == i2);
  for (int t = 0; t < 50; ++t) CHECK(i1[t] > 3);
  CHECK(throws<std::invalid_argument>(
      [&] { f1.sample_softmax(U.data(), 2, 5, ex, 0.0, 1, k1.data(), i1.data()); }));
  for (int64_t k : {10, 4000}) {  // sparse and dense paths
    std::vector<int64_t> r(2 * k);
    f1.sample_random(2, k, ex, 7, r.data());
    std::set<int64_t> a(r.begin(), r.begin() + k), b(r.begin() + k, r.end());
    CHECK(static_cast<int64_t>(a.size()) == k && static_cast<int64_t>(b.size()) == k);
    CHECK(*a.begin() > 3);
    CHECK(*a.rbegin() < n && *b.rbegin() < n);
  }
}

static void test_float16() {
  const float vals[] = {1.0f, 65504.0f, 1e-8f, 5.9604645e-8f, -2.0f, 0.1f};
  Features f(vals, 1, 6, Storage::Float16, 1);
  std::vector<double> r(6);
  int64_t zero = 0;
  f.rows(&zero, 1, r.data());
  CHECK(r[0] == 1.0 && r[1] == 65504.0 && r[2] == 0.0 && r[4] == -2.0);
  CHECK(r[3] == std::ldexp(1.0, -24));
  CHECK(std::fabs(r[5] - 0.1) < 1e-4 && r[5] != 0.1f);
}

static void test_least_squares() {
  const int64_t n = 200, d = 30;
  auto V = randn(n * d, 5);
  Features f(V.data(), n, d, Storage::Float32, 1);
  std::vector<double> a(n);
  for (int64_t i = 0; i < n; ++i) a[i] = std::sin(0.37 * i);
  std::vector<int64_t> items(n);
  std::iota(items.begin(), items.end(), 0);
  for (double ridge : {0.0, 0.3}) {
    LeastSquares ls(f, ridge);
    std::vector<double> u(d), X(n * d);
    f.rows(items.data(), n, X.data());
    int64_t m = 0;
    for (int64_t b : {7, 13, 9, 40, 131}) {
      ls.append(items.data() + m, a.data() + m, b);
      m += b;
      ls.solve(u.data());
      // optimality: X^T (X u - a) + ridge u = 0, and for m < d with ridge 0: X u = a
      std::vector<double> r(m), g(d, 0.0);
      double rn = 0;
      for (int64_t t = 0; t < m; ++t) {
        double s = 0;
        for (int64_t j = 0; j < d; ++j) s += X[t * d + j] * u[j];
        r[t] = s - a[t];
        rn += r[t] * r[t];
        for (int64_t j = 0; j < d; ++j) g[j] += X[t * d + j] * r[t];
      }
      double gn = 0;
      for (int64_t j = 0; j < d; ++j) gn = std::max(gn, std::fabs(g[j] + ridge * u[j]));
      CHECK(gn < 1e-8 * m);
      if (ridge == 0.0 && m < d) CHECK(std::sqrt(rn) < 1e-8);
      CHECK(ls.primal() == (m >= d));
    }
  }
  // rank deficient: duplicate rows with different targets, zero rows: finite
  std::vector<float> W(6 * 4, 0.f);
  for (int j = 0; j < 4; ++j) W[j] = W[4 + j] = static_cast<float>(j + 1);
  Features g(W.data(), 6, 4, Storage::Float32, 1);
  LeastSquares ls(g);
  int64_t it[] = {0, 1, 2, 3};
  double tg[] = {1.0, 3.0, 5.0, -1.0};
  ls.append(it, tg, 4);
  std::vector<double> u(4);
  ls.solve(u.data());
  double fit = 0;
  for (int j = 0; j < 4; ++j) {
    CHECK(std::isfinite(u[j]));
    fit += (j + 1) * u[j];
  }
  CHECK(std::fabs(fit - 2.0) < 1e-6);  // mean of the two targets on the duplicated row
  // errors
  CHECK(throws<std::invalid_argument>([&] { ls.append(it, tg, 1); }));  // appended twice
  int64_t bad = 6;
  CHECK(throws<std::out_of_range>([&] { ls.append(&bad, tg, 1); }));
  int64_t ok = 4;
  double nan = std::nan("");
  CHECK(throws<std::invalid_argument>([&] { ls.append(&ok, &nan, 1); }));
  CHECK(ls.size() == 4);
  CHECK(throws<std::invalid_argument>([&] { LeastSquares(g, -1.0); }));
}

static void test_errors() {
  std::vector<float> V(10 * 3, 1.0f);
  CHECK(throws<std::invalid_argument>([&] { Features(V.data(), 0, 3, Storage::Float32); }));
  V[4] = std::nanf("");
  CHECK(throws<std::invalid_argument>([&] { Features(V.data(), 10, 3, Storage::Float32); }));
  V[4] = 1.0f;
  CHECK(throws<std::invalid_argument>([&] { parse_storage("bf16"); }));
  Features f(V.data(), 10, 3, Storage::Int8, 1);
  float u[3] = {1, 2, 3};
  std::vector<float> s(20);
  std::vector<int64_t> i(20);
  std::vector<int64_t> ids = {0, 1}, off = {0, 2};
  ExcludeLists ex{ids.data(), off.data()};
  CHECK(throws<std::invalid_argument>([&] { f.top_k(u, 1, 9, ex, s.data(), i.data()); }));
  f.top_k(u, 1, 8, ex, s.data(), i.data());
  CHECK(i[0] == 2 && i[7] == 9);  // all tied: ascending ids
  std::vector<int64_t> bad = {10}, off1 = {0, 1};
  ExcludeLists ex2{bad.data(), off1.data()};
  CHECK(throws<std::out_of_range>([&] { f.top_k(u, 1, 1, ex2, s.data(), i.data()); }));
  u[1] = std::nanf("");
  CHECK(throws<std::invalid_argument>([&] { f.top_k(u, 1, 1, {}, s.data(), i.data()); }));
}

int main() {
  std::printf("kernels: %s\n", kernel_name());
  test_top_k(Storage::Float32);
  test_top_k(Storage::Float16);
  test_top_k(Storage::Int8);
  test_sampling();
  test_float16();
  test_least_squares();
  test_errors();
  if (failures) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("all engine checks passed\n");
  return 0;
}
