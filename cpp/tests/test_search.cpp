// ctest executable: .npy reader and memory-mapped / zero-copy Features, the C++ round loop
// (budget accounting, plans, seeds, errors, scorer exceptions). Exit code 0 on success.
// argv[1]: a scratch directory for the .npy files it writes.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "../src/scored_sets.h"
#include "check.h"
#include "crossknn/crossknn.h"

using namespace crossknn;

// IEEE half bits of a float that is exactly representable as a half
static uint16_t half_bits(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  x = std::fabs(x);
  if (x == 0.f) return sign;
  if (x < std::ldexp(1.f, -14)) return sign | static_cast<uint16_t>(x / std::ldexp(1.f, -24));
  int e;
  const float m = std::frexp(x, &e);  // x = m 2^e, m in [0.5, 1)
  const uint16_t mant = static_cast<uint16_t>((m * 2.f - 1.f) * 1024.f);
  return sign | static_cast<uint16_t>((e - 1 + 15) << 10) | mant;
}

// writes a version-1.0 .npy file (header padded to 64 bytes, as NumPy does)
static void write_npy(const std::string& path, const std::string& descr,
                      const std::vector<int64_t>& shape, const void* data, size_t bytes,
                      bool fortran = false) {
  std::string sh = "(";
  for (size_t i = 0; i < shape.size(); ++i)
    sh += std::to_string(shape[i]) + (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
  sh += ")";
  std::string h = "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
                  ", 'shape': " + sh + ", }";
  while ((10 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(h.size());
  const char lb[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  f.write(lb, 2);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

static void test_npy(const std::string& dir) {
  const int64_t n = 300, d = 12;
  auto V = randn(n * d, 3);
  const std::string p = dir + "/V.npy";
  write_npy(p, "<f4", {n, d}, V.data(), V.size() * 4);
  NpyHeader h = read_npy_header(p);
  CHECK(h.dtype == NpyDtype::Float32 && h.shape.size() == 2 && h.shape[0] == n && h.shape[1] == d);
  CHECK(h.data_offset % 64 == 0);

  // a view and a file map give exactly the copy's results
  Features copy(V.data(), n, d, Storage::Float32, 1);
  Features view = Features::view_float32(V.data(), n, d, 2);
  Features mapped = Features::open_npy(p, 1);
  CHECK(!copy.is_view() && view.is_view() && mapped.is_view());
  CHECK(mapped.n_items() == n && mapped.dim() == d && mapped.storage() == Storage::Float32);
  auto U = randn(2 * d, 4);
  std::vector<int64_t> ex = {3, 7}, off = {0, 2, 2};
  std::vector<float> s1(2 * 9), s2(2 * 9), s3(2 * 9);
  std::vector<int64_t> i1(2 * 9), i2(2 * 9), i3(2 * 9);
  copy.top_k(U.data(), 2, 9, {ex.data(), off.data()}, s1.data(), i1.data());
  view.top_k(U.data(), 2, 9, {ex.data(), off.data()}, s2.data(), i2.data());
  mapped.top_k(U.data(), 2, 9, {ex.data(), off.data()}, s3.data(), i3.data());
  CHECK(s1 == s2 && s1 == s3 && i1 == i2 && i1 == i3);

  // float16 and int8 files: the same storage as converting float32 in the core
  Features f16(V.data(), n, d, Storage::Float16, 1), i8(V.data(), n, d, Storage::Int8, 1);
  std::vector<double> rows_a(n * d), rows_b(n * d);
  std::vector<int64_t> all(n);
  for (int64_t i = 0; i < n; ++i) all[i] = i;
  {  // float16: the halves the core stores, written to a file and mapped back
    f16.rows(all.data(), n, rows_a.data());
    std::vector<uint16_t> hv(n * d);
    for (int64_t i = 0; i < n * d; ++i) hv[i] = half_bits(static_cast<float>(rows_a[i]));
    write_npy(dir + "/H.npy", "<f2", {n, d}, hv.data(), hv.size() * 2);
    Features m16 = Features::open_npy(dir + "/H.npy", 1);
    CHECK(m16.storage() == Storage::Float16 && m16.is_view());
    m16.rows(all.data(), n, rows_b.data());
    CHECK(rows_a == rows_b);
    std::vector<float> t1(9), t2(9);
    std::vector<int64_t> j1(9), j2(9);
    f16.top_k(U.data(), 1, 9, {}, t1.data(), j1.data());
    m16.top_k(U.data(), 1, 9, {}, t2.data(), j2.data());
    CHECK(t1 == t2 && j1 == j2);
  }
  {  // int8 + scales
    std::vector<int8_t> q(n * d);
    std::vector<float> sc(n);
    for (int64_t r = 0; r < n; ++r) {
      float mx = 0.f;
      for (int64_t j = 0; j < d; ++j) mx = std::max(mx, std::fabs(V[r * d + j]));
      sc[r] = mx / 127.f;
      for (int64_t j = 0; j < d; ++j)
        q[r * d + j] = static_cast<int8_t>(
            std::min(127.f, std::max(-127.f, std::nearbyint(V[r * d + j] / sc[r]))));
    }
    write_npy(dir + "/Q.npy", "|i1", {n, d}, q.data(), q.size());
    write_npy(dir + "/Q.scales.npy", "<f4", {n}, sc.data(), sc.size() * 4);
    Features m8 = Features::open_npy(dir + "/Q.npy", 1, dir + "/Q.scales.npy");
    CHECK(m8.storage() == Storage::Int8 && m8.is_view());
    i8.rows(all.data(), n, rows_a.data());
    m8.rows(all.data(), n, rows_b.data());
    CHECK(rows_a == rows_b);
    CHECK(throws<std::invalid_argument>([&] { Features::open_npy(dir + "/Q.npy", 1); }));
  }
  // the view keeps its owner alive
  {
    auto owned = std::make_shared<std::vector<float>>(V);
    Features v2 = Features::view_float32(owned->data(), n, d, 1, owned);
    std::weak_ptr<std::vector<float>> w = owned;
    owned.reset();
    CHECK(!w.expired());
    Features v3 = v2;  // a copy shares the matrix
    v2 = copy;
    CHECK(!w.expired());
    v3 = copy;
    CHECK(w.expired());
  }

  // refused files, each with a message
  const std::string bad = dir + "/bad.npy";
  write_npy(bad, ">f4", {n, d}, V.data(), V.size() * 4);
  CHECK(throws<std::invalid_argument>([&] { Features::open_npy(bad); }));
  write_npy(bad, "<f4", {n, d}, V.data(), V.size() * 4, true);
  CHECK(throws<std::invalid_argument>([&] { Features::open_npy(bad); }));
  write_npy(bad, "<f4", {n * d}, V.data(), V.size() * 4);
  CHECK(throws<std::invalid_argument>([&] { Features::open_npy(bad); }));
  write_npy(bad, "<f4", {n, d}, V.data(), V.size() * 2);  // truncated
  CHECK(throws<std::invalid_argument>([&] { Features::open_npy(bad); }));
  write_npy(bad, "<c8", {n, d}, V.data(), V.size() * 4);
  CHECK(throws<std::invalid_argument>([&] { Features::open_npy(bad); }));
  CHECK(throws<std::runtime_error>([&] { Features::open_npy(dir + "/missing.npy"); }));
  {
    std::ofstream f(bad, std::ios::binary);
    f << "not an npy file at all";
  }
  CHECK(throws<std::invalid_argument>([&] { Features::open_npy(bad); }));
  auto W = V;
  W[5 * d + 2] = std::nanf("");
  CHECK(throws<std::invalid_argument>([&] { Features::view_float32(W.data(), n, d); }));
  CHECK(!throws<std::invalid_argument>(
      [&] { Features::view_float32(W.data(), n, d, 1, nullptr, false); }));
}

// exact scorer: a fixed matrix S (Q x N), counting calls and refusing repeats
struct MatrixScorer final : Scorer {
  const std::vector<float>& S;
  int64_t n;
  std::vector<std::set<int64_t>> seen;
  int64_t batches = 0;
  MatrixScorer(const std::vector<float>& s, int64_t q, int64_t n_) : S(s), n(n_), seen(q) {}
  void score(int64_t query, const int64_t* items, int64_t m, float* out) override {
    for (int64_t t = 0; t < m; ++t) {
      if (!seen[query].insert(items[t]).second) throw std::logic_error("scored twice");
      out[t] = S[query * n + items[t]];
    }
  }
  void score_batch(const ScoreRequest* r, int64_t nr) override {
    ++batches;
    Scorer::score_batch(r, nr);
  }
};

// Q x n exact scores V u_q (the scorer's matrix): rounds over V can recover them exactly
static std::vector<float> planted_scores(const std::vector<float>& V, const std::vector<float>& U,
                                         int64_t n, int64_t d, int64_t Q) {
  std::vector<float> S(Q * n);
  for (int64_t q = 0; q < Q; ++q)
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      for (int64_t j = 0; j < d; ++j) s += double(V[i * d + j]) * U[q * d + j];
      S[q * n + i] = static_cast<float>(s);
    }
  return S;
}

static void test_search() {
  const int64_t n = 2000, d = 16, Q = 3;
  auto V = randn(n * d, 5);
  const auto Uq = randn(Q * d, 6);
  const auto S = planted_scores(V, Uq, n, d, Q);
  Features f(V.data(), n, d, Storage::Float32, 2);
  std::vector<SearchQuery> qs(Q);
  for (int64_t q = 0; q < Q; ++q) qs[q].id = static_cast<uint64_t>(q);

  // plans
  CHECK((split_sizes(10, 3) == std::vector<int64_t>{4, 3, 3}));
  auto p = no_split_plan(50, 5);
  CHECK(p.size() == 5 && p[0].kind == StepKind::First && p[4].kind == StepKind::Round);
  auto ps = split_plan(50, 5, 0.5);
  CHECK(ps.size() == 6 && ps[5].kind == StepKind::Retrieve && ps[5].n == 25);
  CHECK(split_plan(5, 1, 0.5)[0].n == 2);  // round half to even, as Python's round()

  for (Strategy st : {Strategy::TopK, Strategy::SoftMax, Strategy::Random}) {
    for (int split = 0; split < 2; ++split) {
      SearchOptions o;
      o.budget = 60;
      o.k = 10;
      o.strategy = st;
      const auto plan = split ? split_plan(o.budget, 4, 0.6) : no_split_plan(o.budget, 4);
      MatrixScorer sc(S, Q, n);
      auto res = search(f, sc, plan, o, qs);
      CHECK(static_cast<int64_t>(res.size()) == Q);
      CHECK(sc.batches == static_cast<int64_t>(plan.size()));  // one batch per step
      for (int64_t q = 0; q < Q; ++q) {
        CHECK(res[q].calls == o.budget);
        std::set<int64_t> u(res[q].scored_items.begin(), res[q].scored_items.end());
        CHECK(static_cast<int64_t>(u.size()) == o.budget);
        CHECK(res[q].ids.size() == 10 && res[q].scores.size() == 10);
        for (int t = 0; t + 1 < 10; ++t) CHECK(res[q].scores[t] >= res[q].scores[t + 1]);
        CHECK(S[q * n + res[q].ids[0]] == res[q].scores[0]);
        // alone = inside the batch
        MatrixScorer one(S, Q, n);
        struct Shift final : Scorer {
          Scorer& s;
          int64_t q;
          Shift(Scorer& s_, int64_t q_) : s(s_), q(q_) {}
          void score(int64_t, const int64_t* it, int64_t m, float* out) override {
            s.score(q, it, m, out);
          }
        } shift(one, q);
        auto r1 = search_one(f, shift, plan, o, qs[q]);
        CHECK(r1.scored_items == res[q].scored_items && r1.ids == res[q].ids);
      }
      if (st == Strategy::TopK && !split) {  // rounds find the planted top items
        int hits = 0;
        for (int64_t q = 0; q < Q; ++q) {
          std::vector<int64_t> order(n);
          for (int64_t i = 0; i < n; ++i) order[i] = i;
          std::partial_sort(order.begin(), order.begin() + 10, order.end(),
                            [&](int64_t a, int64_t b) { return S[q * n + a] > S[q * n + b]; });
          for (int t = 0; t < 10; ++t)
            hits += std::count(res[q].ids.begin(), res[q].ids.end(), order[t]) > 0;
        }
        CHECK(hits >= 27);  // V u recovers the exact scores: d = 16 unknowns
      }
    }
  }

  // first items from the caller, prior mix, k larger than what is scored pads
  {
    SearchOptions o;
    o.budget = 8;
    o.k = 8;
    o.mix = 0.5;
    std::vector<int64_t> first = {1, 2, 3, 4};
    std::vector<double> prior(d, 0.1);
    SearchQuery q{0, first.data(), prior.data()};
    MatrixScorer sc(S, 1, n);
    auto r = search_one(f, sc, {{StepKind::First, 4}, {StepKind::Round, 4}}, o, q);
    CHECK(std::equal(first.begin(), first.end(), r.scored_items.begin()));
    CHECK(r.calls == 8);
    o.budget = 10;
    o.k = 10;
    MatrixScorer sc2(S, 1, n);
    auto r2 = search_one(f, sc2, {{StepKind::First, 4}}, o, q);
    CHECK(r2.calls == 4 && r2.ids[4] == -1 && std::isinf(r2.scores[4]));
  }

  // a dense first stage in the loop: the top items of first_features, as Features::top_k;
  // a tiny query (max|V| sum|u| < 2^-60) is scaled up by a power of two, which keeps its order
  {
    SearchOptions o;
    o.budget = 12;
    o.k = 5;
    o.first_features = &f;
    double vmax = 0;
    for (float v : V) vmax = std::max(vmax, std::fabs(double(v)));
    o.first_vmax = vmax;
    std::vector<float> U0(Uq.begin(), Uq.begin() + 2 * d);
    for (int64_t j = 0; j < d; ++j) U0[d + j] = std::ldexp(U0[d + j], -100);
    std::vector<SearchQuery> q2(2);
    for (int64_t i = 0; i < 2; ++i) q2[i].first_query = U0.data() + i * d;
    MatrixScorer sc(S, 2, n);
    auto r = search(f, sc, {{StepKind::First, 12}}, o, q2);
    std::vector<float> keys(24);
    std::vector<int64_t> top(24);
    f.top_k(Uq.data(), 2, 12, ExcludeLists{}, keys.data(), top.data());
    // an ordinary query: Features::top_k as it is; 2^-100 u ranks as u does
    CHECK(std::equal(top.begin(), top.begin() + 12, r[0].scored_items.begin()));
    CHECK(std::equal(top.begin() + 12, top.end(), r[1].scored_items.begin()));
    std::vector<float> scaled(d);
    scale_first_query(U0.data() + d, d, vmax, scaled.data());
    const double ratio = double(scaled[0]) / double(U0[d]);
    int e = 0;
    CHECK(ratio > 1e20 && std::frexp(ratio, &e) == 0.5);  // scaled up by a power of two
    for (int64_t j = 0; j < d; ++j) CHECK(double(scaled[j]) == ratio * double(U0[d + j]));
    scale_first_query(Uq.data(), d, vmax, scaled.data());  // an ordinary query: as it is
    CHECK(std::equal(scaled.begin(), scaled.end(), Uq.begin()));
    q2[1].first_query = nullptr;  // every query needs its vector
    MatrixScorer sc2(S, 2, n);
    CHECK(throws<std::invalid_argument>([&] { search(f, sc2, {{StepKind::First, 12}}, o, q2); }));
  }

  // errors: budget, duplicates, bad plans, bad scores; scorer exceptions pass through unchanged
  {
    SearchOptions o;
    o.budget = 10;
    o.k = 5;
    MatrixScorer sc(S, 1, n);
    CHECK(throws<std::invalid_argument>([&] { search_one(f, sc, {{StepKind::First, 11}}, o); }));
    CHECK(throws<std::invalid_argument>([&] { search_one(f, sc, {{StepKind::Round, 5}}, o); }));
    CHECK(throws<std::invalid_argument>([&] { search_one(f, sc, {}, o); }));
    std::vector<int64_t> dup = {1, 1, 2};
    SearchQuery qd{0, dup.data(), nullptr};
    CHECK(throws<std::invalid_argument>([&] { search_one(f, sc, {{StepKind::First, 3}}, o, qd); }));
    std::vector<int64_t> out_of_range = {1, n};
    SearchQuery qr{0, out_of_range.data(), nullptr};
    CHECK(throws<std::invalid_argument>([&] { search_one(f, sc, {{StepKind::First, 2}}, o, qr); }));
    o.mix = 0.5;  // needs a prior
    CHECK(throws<std::invalid_argument>([&] { search_one(f, sc, no_split_plan(10, 2), o); }));
    o.mix = 0.0;
    o.k = 11;
    CHECK(throws<std::invalid_argument>([&] { search_one(f, sc, no_split_plan(10, 2), o); }));
    o.k = 5;
    FunctionScorer nan_scorer([](int64_t, const int64_t*, int64_t m, float* out) {
      for (int64_t t = 0; t < m; ++t) out[t] = std::nanf("");
    });
    CHECK(
        throws<std::invalid_argument>([&] { search_one(f, nan_scorer, no_split_plan(10, 2), o); }));
    struct Boom {};
    FunctionScorer boom([](int64_t, const int64_t*, int64_t, float*) { throw Boom{}; });
    bool got = false;
    try {
      search_one(f, boom, no_split_plan(10, 2), o);
    } catch (const Boom&) {
      got = true;
    }
    CHECK(got);
  }

  // query_seed reproduces crossknn.search.query_seed (values from NumPy's SeedSequence)
  CHECK(query_seed(0, 0) == 6375474604893067239ULL);
  CHECK(query_seed(7, 3) == 7443599362937997628ULL);
  CHECK(query_seed(1ULL << 40, 123456789012ULL) == 2599386372348279959ULL);
}

// top-n ids of V u (u rounded to float as the loop does) outside `skip`, ties to the lower id
static std::vector<int64_t> brute_top(const std::vector<float>& V, int64_t n_items, int64_t d,
                                      const std::vector<double>& u, int64_t n,
                                      const std::vector<int64_t>& skip) {
  std::vector<std::pair<double, int64_t>> s;
  for (int64_t i = 0; i < n_items; ++i) {
    if (std::find(skip.begin(), skip.end(), i) != skip.end()) continue;
    double v = 0;
    for (int64_t j = 0; j < d; ++j) v += double(V[i * d + j]) * double(float(u[j]));
    s.push_back({-v, i});
  }
  std::sort(s.begin(), s.end());
  std::vector<int64_t> out;
  for (int64_t t = 0; t < n; ++t) out.push_back(s[t].second);
  return out;
}

// Solve::Targets, Solve::PriorRidge (against the primal normal equations) and the selector hook
static void test_solves() {
  const int64_t n = 400, d = 6;
  auto V = randn(n * d, 11);
  auto ut = randn(d, 12);
  std::vector<float> S(n);
  for (int64_t i = 0; i < n; ++i) {
    double v = 0;
    for (int64_t j = 0; j < d; ++j) v += double(V[i * d + j]) * ut[j];
    S[i] = static_cast<float>(v + 0.1 * std::sin(double(i)));
  }
  Features f(V.data(), n, d, Storage::Float32, 1);
  FunctionScorer sc([&](int64_t, const int64_t* it, int64_t m, float* out) {
    for (int64_t t = 0; t < m; ++t) out[t] = S[it[t]];
  });
  const std::vector<int64_t> first = {3, 17, 40, 41, 99, 150, 200, 333};
  SearchQuery q;
  q.first_items = first.data();
  // Targets: u = the first d scores
  {
    SearchOptions o;
    o.budget = 11;
    o.k = 5;
    o.solve = Solve::Targets;
    std::vector<Step> plan = {{StepKind::First, d}, {StepKind::Retrieve, 5}};
    auto r = search_one(f, sc, plan, o, q);
    std::vector<double> u(first.begin(), first.begin() + d);
    for (int64_t j = 0; j < d; ++j) u[j] = S[first[j]];
    auto want = brute_top(V, n, d, u, 5, std::vector<int64_t>(first.begin(), first.begin() + d));
    CHECK(std::vector<int64_t>(r.scored_items.begin() + d, r.scored_items.end()) == want);
    std::vector<Step> too_few = {{StepKind::First, 3}, {StepKind::Round, 2}};
    CHECK(throws<std::invalid_argument>([&] { search_one(f, sc, too_few, o, q); }));
  }
  // PriorRidge: (Z^T Z + diag(rho)) (w, c) = Z^T a with Z = [X_A, X_A p0]; u = w + c p0
  {
    auto pf = randn(d, 13);
    std::vector<double> p0(pf.begin(), pf.end());
    std::vector<double> rho = {0.3, 0.3, 0.1, 0.1, 0.2, 1e-6, 1e-6};
    SearchOptions o;
    o.budget = 13;
    o.k = 5;
    o.solve = Solve::PriorRidge;
    for (double r : rho) o.inv_penalties.push_back(1.0 / r);
    SearchQuery qp = q;
    qp.prior = p0.data();
    std::vector<Step> plan = {{StepKind::First, 8}, {StepKind::Round, 5}};
    struct Rec final : RoundSelector {
      const Features* f;
      int calls = 0;
      void top_k(const float* U, int64_t Q, int64_t k, const ExcludeLists& ex, float* keys,
                 int64_t* out) override {
        ++calls;
        f->top_k(U, Q, k, ex, keys, out);
      }
      void sample_softmax(const float* u, int64_t k, const ExcludeLists& ex, double t,
                          uint64_t seed, float* keys, int64_t* out) override {
        ++calls;
        f->sample_softmax(u, 1, k, ex, t, seed, keys, out);
      }
    } rec;
    rec.f = &f;
    o.selector = &rec;
    auto r = search_one(f, sc, plan, o, qp);
    CHECK(rec.calls == 1);
    const int64_t D1 = d + 1;
    std::vector<double> A(D1 * D1, 0.0), b(D1, 0.0);
    for (int64_t t = 0; t < 8; ++t) {
      std::vector<double> z(D1, 0.0);
      for (int64_t j = 0; j < d; ++j) {
        z[j] = V[first[t] * d + j];
        z[d] += z[j] * p0[j];
      }
      for (int64_t i = 0; i < D1; ++i) {
        b[i] += z[i] * S[first[t]];
        for (int64_t j = 0; j < D1; ++j) A[i * D1 + j] += z[i] * z[j];
      }
    }
    for (int64_t i = 0; i < D1; ++i) A[i * D1 + i] += rho[i];
    for (int64_t c = 0; c < D1; ++c)  // Gaussian elimination (SPD: no pivoting needed)
      for (int64_t r2 = c + 1; r2 < D1; ++r2) {
        const double m = A[r2 * D1 + c] / A[c * D1 + c];
        for (int64_t j = c; j < D1; ++j) A[r2 * D1 + j] -= m * A[c * D1 + j];
        b[r2] -= m * b[c];
      }
    std::vector<double> w(D1);
    for (int64_t i = D1 - 1; i >= 0; --i) {
      double v = b[i];
      for (int64_t j = i + 1; j < D1; ++j) v -= A[i * D1 + j] * w[j];
      w[i] = v / A[i * D1 + i];
    }
    std::vector<double> u(d);
    for (int64_t j = 0; j < d; ++j) u[j] = w[j] + w[d] * p0[j];
    CHECK(std::vector<int64_t>(r.scored_items.begin() + 8, r.scored_items.end()) ==
          brute_top(V, n, d, u, 5, first));
    o.inv_penalties.pop_back();  // d values: refused
    CHECK(throws<std::invalid_argument>([&] { search_one(f, sc, plan, o, qp); }));
  }
}

// the budget accounting's scored sets: bits and hash sets agree on every insert
static void test_scored_sets() {
  const int64_t Q = 3, n = 130;  // 3 words a query
  crossknn::detail::ScoredSets bits(Q, n), sets(Q, n, 0.0);
  CHECK(bits.uses_bits() && !sets.uses_bits());
  std::mt19937_64 rng(9);
  std::set<std::pair<int64_t, int64_t>> ref;
  for (int t = 0; t < 600; ++t) {
    const int64_t q = static_cast<int64_t>(rng() % Q), it = static_cast<int64_t>(rng() % n);
    const bool fresh = ref.insert({q, it}).second;
    CHECK(bits.insert(q, it) == fresh);
    CHECK(sets.insert(q, it) == fresh);
  }
  CHECK(bits.insert(2, 129) == !ref.count({2, 129}));  // the last bit of the last word
}

// allow masks: no disallowed item chosen, scored or returned, in every strategy and in a batch
// of mixed masks; a mask of at most B items is scored whole in one step (its exact top-k); fewer
// than k pads; a first item outside the mask is refused
static void test_masks() {
  const int64_t n = 1500, d = 12, Q = 4;
  auto V = randn(n * d, 21);
  const auto S = planted_scores(V, randn(Q * d, 22), n, d, Q);
  Features f(V.data(), n, d, Storage::Float32, 2);
  const int64_t W = mask_words(n);
  std::mt19937_64 rng(5);
  // query 0: 40% allowed, 1: no mask, 2: 25 items (<= B), 3: 3 items (< k)
  std::vector<std::vector<uint64_t>> masks(Q, std::vector<uint64_t>(W, 0));
  std::vector<int64_t> want_allowed = {-1, n, 25, 3};
  for (int64_t i = 0; i < n; ++i)
    if (rng() % 10 < 4) masks[0][i >> 6] |= uint64_t{1} << (i & 63);
  for (int64_t q = 2; q < 4; ++q) {
    std::set<int64_t> pick;
    while (static_cast<int64_t>(pick.size()) < want_allowed[q]) pick.insert(rng() % n);
    for (int64_t i : pick) masks[q][i >> 6] |= uint64_t{1} << (i & 63);
  }
  CHECK(mask_count(masks[2].data(), n) == 25 && mask_count(nullptr, n) == n);
  std::vector<SearchQuery> qs(Q);
  for (int64_t q = 0; q < Q; ++q) {
    qs[q].id = static_cast<uint64_t>(q);
    if (q != 1) qs[q].allow = masks[q].data();
  }
  for (Strategy st : {Strategy::TopK, Strategy::SoftMax, Strategy::Random}) {
    SearchOptions o;
    o.budget = 40;
    o.k = 5;
    o.strategy = st;
    MatrixScorer sc(S, Q, n);
    const auto plan = no_split_plan(o.budget, 4);
    auto res = search(f, sc, plan, o, qs);
    CHECK(sc.batches == static_cast<int64_t>(plan.size()));
    for (int64_t q = 0; q < Q; ++q) {
      const uint64_t* m = qs[q].allow;
      for (int64_t it : sc.seen[q]) CHECK(mask_allows(m, it));
      for (int64_t id : res[q].ids) CHECK(id == -1 || mask_allows(m, id));
    }
    CHECK(res[0].calls == 40 && res[1].calls == 40);
    for (int64_t q = 2; q < 4; ++q) {  // every allowed item, once; the exact top-k among them
      CHECK(res[q].calls == want_allowed[q]);
      std::vector<int64_t> allowed;
      for (int64_t i = 0; i < n; ++i)
        if (mask_allows(qs[q].allow, i)) allowed.push_back(i);
      std::sort(allowed.begin(), allowed.end(),
                [&](int64_t a, int64_t b) { return S[q * n + a] > S[q * n + b]; });
      const int64_t kk = std::min<int64_t>(5, static_cast<int64_t>(allowed.size()));
      for (int64_t t = 0; t < kk; ++t) CHECK(res[q].ids[t] == allowed[t]);
      for (int64_t t = kk; t < 5; ++t) CHECK(res[q].ids[t] == -1);
    }
    // the unmasked query searches as it does alone
    MatrixScorer one(S, Q, n);
    struct Shift final : Scorer {
      Scorer& s;
      Shift(Scorer& s_) : s(s_) {}
      void score(int64_t, const int64_t* it, int64_t m, float* out) override {
        s.score(1, it, m, out);
      }
    } shift(one);
    CHECK(search_one(f, shift, plan, o, qs[1]).ids == res[1].ids);
  }
  // first items must lie in the mask
  {
    SearchOptions o;
    o.budget = 40;
    o.k = 5;
    std::vector<int64_t> first(10);
    for (int64_t i = 0, t = 0; t < 10; ++i)
      if (!mask_allows(masks[0].data(), i)) first[t++] = i;
    SearchQuery q;
    q.first_items = first.data();
    q.allow = masks[0].data();
    MatrixScorer sc(S, 1, n);
    CHECK(throws<std::invalid_argument>(
        [&] { search_one(f, sc, no_split_plan(o.budget, 4), o, q); }));
    CHECK(sc.seen[0].empty());  // refused before any call
  }
}

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "test_search_tmp";
  ::mkdir(dir.c_str(), 0755);
  test_npy(dir);
  test_search();
  test_solves();
  test_scored_sets();
  test_masks();
  if (failures) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("all checks passed\n");
  return 0;
}
