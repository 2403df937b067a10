// pybind11 bindings for the C++ core: numpy in, numpy out; no logic here.
// Every array argument is checked (type, dtype, C order, shape) before any pointer is taken;
// outputs are allocated under the GIL and the GIL is released around every kernel. C++
// exceptions are translated by pybind11: invalid_argument/length_error -> ValueError,
// out_of_range -> IndexError, bad_alloc -> MemoryError.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "crossknn/features.h"
#include "crossknn/least_squares.h"
#include "crossknn/npy.h"
#include "crossknn/prior.h"
#include "crossknn/search.h"
#include "crossknn/version.h"

namespace py = pybind11;
void bind_index(py::module_& m);  // bindings_index.cpp
using crossknn::ExcludeLists;
using crossknn::Features;
using crossknn::LeastSquares;

namespace {

template <class T>
const char* dtype_name();
template <>
const char* dtype_name<float>() {
  return "float32";
}
template <>
const char* dtype_name<double>() {
  return "float64";
}
template <>
const char* dtype_name<int64_t>() {
  return "int64";
}
template <>
const char* dtype_name<uint64_t>() {
  return "uint64";
}
template <>
const char* dtype_name<int8_t>() {
  return "int8";
}
template <>
const char* dtype_name<uint16_t>() {
  return "float16";
}

// A C-contiguous array of exactly dtype T with `ndim` dimensions, or TypeError/ValueError.
template <class T>
py::array_t<T, py::array::c_style> expect(const py::handle& obj, const char* name, int ndim) {
  if (!py::isinstance<py::array>(obj))
    throw py::type_error(std::string(name) + " must be a numpy array of " + dtype_name<T>() +
                         "; got " + std::string(py::str(py::type::of(obj).attr("__name__"))));
  auto arr = py::reinterpret_borrow<py::array>(obj);
  if (!arr.dtype().equal(py::dtype::of<T>()))
    throw py::type_error(std::string(name) + " must have dtype " + dtype_name<T>() + "; got " +
                         std::string(py::str(arr.dtype())));
  if (arr.ndim() != ndim)
    throw py::value_error(std::string(name) + " must be " + std::to_string(ndim) + "-D; got " +
                          std::to_string(arr.ndim()) + "-D");
  if (!(arr.flags() & py::array::c_style))
    throw py::value_error(std::string(name) + " must be C-contiguous");
  return py::array_t<T, py::array::c_style>::ensure(arr);
}

// Keeps a Python object alive from C++ (a view's owner); the last release takes the GIL.
std::shared_ptr<const void> keep_alive(py::object obj) {
  return std::shared_ptr<const void>(new py::object(std::move(obj)), [](const void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<const py::object*>(p);
  });
}

std::string shape_str(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i)
    s += std::to_string(a.shape(i)) + (a.ndim() == 1 ? "," : (i + 1 < a.ndim() ? ", " : ""));
  return s + ")";
}

// A zero-copy Features over a C-contiguous 2-D numpy array: float32, float16, or int8 with
// `scales` (float32 (N,)); the array (and scales) stay alive as long as the Features.
std::shared_ptr<Features> features_view(const py::handle& V, const py::object& scales, int threads,
                                        bool check_finite) {
  if (!py::isinstance<py::array>(V))
    throw py::type_error("V must be a numpy array; got " +
                         std::string(py::str(py::type::of(V).attr("__name__"))));
  auto a = py::reinterpret_borrow<py::array>(V);
  if (a.ndim() != 2) throw py::value_error("V must be 2-D (N x d); got shape " + shape_str(a));
  if (!(a.flags() & py::array::c_style))
    throw py::value_error("a view needs a C-contiguous V (np.ascontiguousarray)");
  const int64_t n = a.shape(0), d = a.shape(1);
  if (n == 0 || d == 0)
    throw py::value_error("V must be non-empty (N x d with N, d > 0); got " + shape_str(a));
  const char kind = a.dtype().kind();
  const auto size = a.dtype().itemsize();
  if (!a.dtype().attr("isnative").cast<bool>())
    throw py::value_error("V must be in native byte order; got dtype " +
                          std::string(py::str(a.dtype())));
  const void* p = a.data();
  if (kind == 'f' && size == 4) {
    if (!scales.is_none()) throw py::value_error("scales are only for int8 V");
    auto owner = keep_alive(a);
    py::gil_scoped_release release;
    return std::make_shared<Features>(
        Features::view_float32(static_cast<const float*>(p), n, d, threads, owner, check_finite));
  }
  if (kind == 'f' && size == 2) {
    if (!scales.is_none()) throw py::value_error("scales are only for int8 V");
    auto owner = keep_alive(a);
    py::gil_scoped_release release;
    return std::make_shared<Features>(Features::view_float16(static_cast<const uint16_t*>(p), n, d,
                                                             threads, owner, check_finite));
  }
  if (kind == 'i' && size == 1) {
    if (scales.is_none())
      throw py::value_error("an int8 V needs its row scales (float32 of shape (N,))");
    auto sc = expect<float>(scales, "scales", 1);
    if (sc.shape(0) != n)
      throw py::value_error("scales must have shape (" + std::to_string(n) + ",); got (" +
                            std::to_string(sc.shape(0)) + ",)");
    auto owner = keep_alive(py::make_tuple(a, sc));
    const float* ps = sc.data();
    py::gil_scoped_release release;
    return std::make_shared<Features>(
        Features::view_int8(static_cast<const int8_t*>(p), ps, n, d, threads, owner, check_finite));
  }
  throw py::type_error("a view needs V of dtype float32, float16 or int8; got " +
                       std::string(py::str(a.dtype())));
}

// The C++ loop's scorer: calls a Python callable scorer(queries, items) -> sequence of float
// arrays (queries: int64 positions in the batch, items: list of int64 arrays), once per step.
// The GIL is taken only inside this call; Python exceptions propagate unchanged.
class PyScorer final : public crossknn::Scorer {
 public:
  explicit PyScorer(py::object fn) : fn_(std::move(fn)) {}
  void score(int64_t query, const int64_t* items, int64_t m, float* out) override {
    crossknn::ScoreRequest r{query, items, m, out};
    score_batch(&r, 1);
  }
  void score_batch(const crossknn::ScoreRequest* req, int64_t nr) override {
    py::gil_scoped_acquire gil;
    py::array_t<int64_t> qs(nr);
    py::list items;
    for (int64_t r = 0; r < nr; ++r) {
      qs.mutable_data()[r] = req[r].query;
      py::array_t<int64_t> it(req[r].m);
      std::copy(req[r].items, req[r].items + req[r].m, it.mutable_data());
      items.append(it);
    }
    py::object got = fn_(qs, items);
    if (!py::isinstance<py::sequence>(got) || static_cast<int64_t>(py::len(got)) != nr)
      throw py::value_error("the scorer must return a sequence of " + std::to_string(nr) +
                            " score arrays (one per query); got " +
                            std::string(py::str(py::repr(got))).substr(0, 80));
    py::sequence seq = py::reinterpret_borrow<py::sequence>(got);
    for (int64_t r = 0; r < nr; ++r) {
      auto s = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(seq[r]);
      if (!s || s.size() != req[r].m)
        throw py::value_error("the scorer returned " +
                              (s ? std::to_string(s.size()) : std::string("no")) + " scores for " +
                              std::to_string(req[r].m) + " items (query " +
                              std::to_string(req[r].query) + ")");
      std::copy(s.data(), s.data() + req[r].m, req[r].out);
    }
  }

 private:
  py::object fn_;
};

// Largest result of one sampling call, in ids (2 GiB of int64): more is refused up front instead
// of failing the allocation (std::bad_alloc / MemoryError).
constexpr int64_t kMaxResultIds = int64_t{1} << 28;

void check_result_size(int64_t Q, int64_t k, const char* what) {
  if (k > 0 && Q > kMaxResultIds / k)
    throw py::value_error(std::string(what) + ": n_queries x k = " + std::to_string(Q) + " x " +
                          std::to_string(k) + " result ids exceed the limit of 2**28 (" +
                          std::to_string(kMaxResultIds) +
                          ") per call; split the queries into smaller calls");
}

// Allow masks from Python: None, one uint64 mask of mask_words(N) words shared by the Q queries
// (1-D), or one per query (Q x words); the pointers live as long as this object.
struct Masks {
  py::array_t<uint64_t, py::array::c_style> words;
  std::vector<const uint64_t*> rows;
  const uint64_t* const* data() const { return rows.empty() ? nullptr : rows.data(); }
};

Masks make_masks(const py::object& allow, int64_t Q, int64_t n_items) {
  Masks m;
  if (allow.is_none()) return m;
  if (!py::isinstance<py::array>(allow))
    throw py::type_error("allow must be a numpy uint64 array of packed bits; got " +
                         std::string(py::str(py::type::of(allow).attr("__name__"))));
  const int ndim = py::reinterpret_borrow<py::array>(allow).ndim();
  if (ndim != 1 && ndim != 2)
    throw py::value_error("allow must be 1-D (one mask for every query) or 2-D (Q x words); got " +
                          std::to_string(ndim) + "-D");
  m.words = expect<uint64_t>(allow, "allow", ndim);
  const int64_t words = crossknn::mask_words(n_items);
  const int64_t got = m.words.shape(ndim - 1);
  if (got != words)
    throw py::value_error("an allow mask over " + std::to_string(n_items) + " items has " +
                          std::to_string(words) + " uint64 words; got " + std::to_string(got));
  if (ndim == 2 && m.words.shape(0) != Q)
    throw py::value_error("allow has " + std::to_string(m.words.shape(0)) + " masks for " +
                          std::to_string(Q) + " queries");
  m.rows.resize(static_cast<size_t>(Q));
  for (int64_t q = 0; q < Q; ++q) m.rows[q] = m.words.data() + (ndim == 2 ? q * words : 0);
  return m;
}

// Round selection through a Python object with ItemFeatures' top_k / sample_softmax (a FAISS
// round index, item shards, a recording wrapper); called with the GIL held.
class PySelector final : public crossknn::RoundSelector {
 public:
  PySelector(py::object obj, int64_t d, int64_t n_items)
      : obj_(std::move(obj)), d_(d), words_(crossknn::mask_words(n_items)) {}
  void top_k(const float* U, int64_t Q, int64_t n, const crossknn::ExcludeLists& ex, float* keys,
             int64_t* out) override {
    py::gil_scoped_acquire gil;
    py::array_t<float> u({Q, d_});
    std::copy(U, U + Q * d_, u.mutable_data());
    py::list exclude;
    for (int64_t q = 0; q < Q; ++q) exclude.append(ids_of(ex, q));
    py::object got;
    if (ex.allow) {
      py::list allow;
      for (int64_t q = 0; q < Q; ++q) allow.append(mask_of(ex, q));
      got = obj_.attr("top_k")(u, n, py::arg("exclude") = exclude, py::arg("allow") = allow);
    } else {
      got = obj_.attr("top_k")(u, n, py::arg("exclude") = exclude);
    }
    copy_pair(got, Q * n, keys, out, "top_k");
  }
  void sample_softmax(const float* u, int64_t n, const crossknn::ExcludeLists& ex,
                      double temperature, uint64_t seed, float* keys, int64_t* out) override {
    py::gil_scoped_acquire gil;
    py::array_t<float> uu(d_);
    std::copy(u, u + d_, uu.mutable_data());
    py::object got = ex.allow
                         ? obj_.attr("sample_softmax")(uu, n, py::arg("exclude") = ids_of(ex, 0),
                                                       py::arg("temperature") = temperature,
                                                       py::arg("seed") = py::int_(seed),
                                                       py::arg("allow") = mask_of(ex, 0))
                         : obj_.attr("sample_softmax")(uu, n, py::arg("exclude") = ids_of(ex, 0),
                                                       py::arg("temperature") = temperature,
                                                       py::arg("seed") = py::int_(seed));
    copy_pair(got, n, keys, out, "sample_softmax");
  }

 private:
  static py::array_t<int64_t> ids_of(const crossknn::ExcludeLists& ex, int64_t q) {
    const int64_t lo = ex.offsets ? ex.offsets[q] : 0, hi = ex.offsets ? ex.offsets[q + 1] : 0;
    py::array_t<int64_t> a(hi - lo);
    if (hi > lo) std::copy(ex.ids + lo, ex.ids + hi, a.mutable_data());
    return a;
  }
  // query q's allow mask as a uint64 array of mask_words(N) words (None: every item)
  py::object mask_of(const crossknn::ExcludeLists& ex, int64_t q) const {
    const uint64_t* w = ex.allow_of(q);
    if (!w) return py::none();
    py::array_t<uint64_t> a(words_);
    std::copy(w, w + words_, a.mutable_data());
    return std::move(a);
  }
  static void copy_pair(const py::object& got, int64_t count, float* keys, int64_t* out,
                        const char* what) {
    py::tuple t = py::reinterpret_borrow<py::tuple>(py::tuple(got));
    if (t.size() != 2)
      throw py::value_error(std::string("the round selector's ") + what +
                            " must return (scores, indices)");
    auto s = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(t[0]);
    auto i = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(t[1]);
    if (!s || !i || s.size() != count || i.size() != count)
      throw py::value_error(std::string("the round selector's ") + what + " returned " +
                            (i ? std::to_string(i.size()) : std::string("no")) +
                            " indices; expected " + std::to_string(count));
    std::copy(s.data(), s.data() + count, keys);
    std::copy(i.data(), i.data() + count, out);
  }
  py::object obj_;
  int64_t d_, words_;
};

crossknn::Solve parse_solve(const std::string& s) {
  if (s == "lstsq") return crossknn::Solve::LeastSquares;
  if (s == "targets") return crossknn::Solve::Targets;
  if (s == "prior_ridge") return crossknn::Solve::PriorRidge;
  throw py::value_error("solve must be 'lstsq', 'targets' or 'prior_ridge'; got '" + s + "'");
}

crossknn::StepKind parse_kind(const std::string& k) {
  if (k == "first") return crossknn::StepKind::First;
  if (k == "round") return crossknn::StepKind::Round;
  if (k == "retrieve") return crossknn::StepKind::Retrieve;
  throw py::value_error("step kind must be 'first', 'round' or 'retrieve'; got '" + k + "'");
}

crossknn::Strategy parse_strategy(const std::string& s) {
  if (s == "topk") return crossknn::Strategy::TopK;
  if (s == "softmax") return crossknn::Strategy::SoftMax;
  if (s == "random") return crossknn::Strategy::Random;
  throw py::value_error("strategy must be 'topk', 'softmax' or 'random'; got '" + s + "'");
}

py::dict run_search(std::shared_ptr<Features> f, py::object scorer,
                    const std::vector<std::pair<std::string, int64_t>>& plan_in,
                    const std::vector<uint64_t>& query_ids, int64_t budget, int64_t k,
                    const std::string& strategy, double temperature, double ridge, int refine,
                    double jitter_rel, double mix, uint64_t seed, const py::object& first_items,
                    const py::object& priors, double score_alpha, double score_beta,
                    const std::string& solve, const py::object& inv_penalties, double penalty_decay,
                    bool final_retrieved, const py::object& selector,
                    const py::object& first_features, const py::object& first_queries,
                    double first_vmax, const py::object& allow, double stop_threshold,
                    bool stop_trace) {
  if (!f) throw py::type_error("features must be a crossknn._core.Features");
  if (!PyCallable_Check(scorer.ptr())) throw py::type_error("scorer must be callable");
  std::vector<crossknn::Step> plan;
  for (const auto& st : plan_in) plan.push_back({parse_kind(st.first), st.second});
  crossknn::SearchOptions o;
  o.budget = budget;
  o.k = k;
  o.strategy = parse_strategy(strategy);
  o.temperature = temperature;
  o.ridge = ridge;
  o.refine = refine;
  o.jitter_rel = jitter_rel;
  o.mix = mix;
  o.seed = seed;
  o.score_alpha = score_alpha;
  o.score_beta = score_beta;
  o.solve = parse_solve(solve);
  if (!inv_penalties.is_none()) {
    auto ip = expect<double>(inv_penalties, "inv_penalties", 1);
    o.inv_penalties.assign(ip.data(), ip.data() + ip.shape(0));
  }
  o.penalty_decay = penalty_decay;
  o.final_retrieved = final_retrieved;
  o.stop_threshold = stop_threshold;
  o.stop_trace = stop_trace;
  std::unique_ptr<PySelector> sel;
  if (!selector.is_none()) {
    sel = std::make_unique<PySelector>(selector, f->dim(), f->n_items());
    o.selector = sel.get();
  }
  const int64_t Q = static_cast<int64_t>(query_ids.size());
  std::vector<crossknn::SearchQuery> qs(static_cast<size_t>(Q));
  std::shared_ptr<Features> ff;  // the dense first stage (kept alive for the call)
  py::array_t<float, py::array::c_style> fq;
  if (first_features.is_none() != first_queries.is_none())
    throw py::value_error("first_features and first_queries must both be given or both be None");
  if (!first_features.is_none()) {
    if (!first_items.is_none())
      throw py::value_error("give first_items or a dense first stage (first_features), not both");
    ff = first_features.cast<std::shared_ptr<Features>>();
    if (!ff) throw py::type_error("first_features must be a crossknn._core.Features");
    fq = expect<float>(first_queries, "first_queries", 2);
    if (fq.shape(0) != Q || fq.shape(1) != ff->dim())
      throw py::value_error("first_queries must have shape (Q, d) = (" + std::to_string(Q) + ", " +
                            std::to_string(ff->dim()) + "); got " + shape_str(fq));
    o.first_features = ff.get();
    o.first_vmax = first_vmax;
  }
  py::array_t<int64_t, py::array::c_style> fi;
  py::array_t<double, py::array::c_style> pr;
  if (!first_items.is_none()) {
    fi = expect<int64_t>(first_items, "first_items", 2);
    const int64_t n0 = plan.empty() ? 0 : plan[0].n;
    if (fi.shape(0) != Q || fi.shape(1) != n0)
      throw py::value_error("first_items must have shape (Q, n) = (" + std::to_string(Q) + ", " +
                            std::to_string(n0) + "); got " + shape_str(fi));
  }
  if (!priors.is_none()) {
    pr = expect<double>(priors, "priors", 2);
    if (pr.shape(0) != Q || pr.shape(1) != f->dim())
      throw py::value_error("priors must have shape (Q, d) = (" + std::to_string(Q) + ", " +
                            std::to_string(f->dim()) + "); got " + shape_str(pr));
  }
  const Masks masks = make_masks(allow, Q, f->n_items());
  for (int64_t i = 0; i < Q; ++i) {
    qs[i].id = query_ids[i];
    if (masks.data()) qs[i].allow = masks.rows[i];
    if (!first_items.is_none()) qs[i].first_items = fi.data() + i * fi.shape(1);
    if (!priors.is_none()) qs[i].prior = pr.data() + i * f->dim();
    if (ff) qs[i].first_query = fq.data() + i * ff->dim();
  }
  PyScorer ps(std::move(scorer));
  std::vector<crossknn::SearchResult> res;
  {
    py::gil_scoped_release release;
    res = crossknn::search(*f, ps, plan, o, qs);
  }
  py::array_t<float> S({Q, k});
  py::array_t<int64_t> I({Q, k}), calls(Q);
  py::array_t<int8_t> stopped(Q);
  py::list items, scores, chances;
  for (int64_t i = 0; i < Q; ++i) {
    stopped.mutable_data()[i] = static_cast<int8_t>(res[i].stopped);
    chances.append(py::array_t<double>(static_cast<py::ssize_t>(res[i].stop_chance.size()),
                                       res[i].stop_chance.data()));
    std::copy(res[i].scores.begin(), res[i].scores.end(), S.mutable_data() + i * k);
    std::copy(res[i].ids.begin(), res[i].ids.end(), I.mutable_data() + i * k);
    calls.mutable_data()[i] = res[i].calls;
    items.append(py::array_t<int64_t>(static_cast<py::ssize_t>(res[i].scored_items.size()),
                                      res[i].scored_items.data()));
    scores.append(py::array_t<float>(static_cast<py::ssize_t>(res[i].scored_scores.size()),
                                     res[i].scored_scores.data()));
  }
  py::dict out;
  out["scores"] = S;
  out["indices"] = I;
  out["ce_calls"] = calls;
  out["scored_items"] = items;
  out["scored_scores"] = scores;
  out["stopped"] = stopped;  // 0 budget, 1 found, 2 allowed (crossknn::StopReason)
  out["stop_chance"] = chances;
  return out;
}

struct Exclude {
  py::array_t<int64_t, py::array::c_style> ids, offsets;
  Masks masks;
  ExcludeLists lists;
};

Exclude make_exclude(const py::object& ids, const py::object& offsets, int64_t Q,
                     const py::object& allow, int64_t n_items) {
  Exclude e;
  if (ids.is_none() != offsets.is_none())
    throw py::value_error("exclude ids and offsets must both be given or both be None");
  e.masks = make_masks(allow, Q, n_items);
  e.lists.allow = e.masks.data();
  if (ids.is_none()) return e;
  e.ids = expect<int64_t>(ids, "exclude ids", 1);
  e.offsets = expect<int64_t>(offsets, "exclude offsets", 1);
  if (e.offsets.shape(0) != Q + 1)
    throw py::value_error("exclude offsets must have Q + 1 = " + std::to_string(Q + 1) +
                          " entries; got " + std::to_string(e.offsets.shape(0)));
  const int64_t* o = e.offsets.data();
  if (o[0] != 0 || o[Q] != e.ids.shape(0))
    throw py::value_error("exclude offsets must start at 0 and end at len(ids)");
  for (int64_t q = 0; q < Q; ++q)
    if (o[q + 1] < o[q]) throw py::value_error("exclude offsets must be non-decreasing");
  e.lists.ids = e.ids.data();
  e.lists.offsets = o;
  return e;
}

py::array_t<float, py::array::c_style> expect_queries(const py::handle& U, const Features& f) {
  auto u = expect<float>(U, "u", 2);
  if (u.shape(1) != f.dim())
    throw py::value_error("u must have shape (Q, d) with d=" + std::to_string(f.dim()) + "; got (" +
                          std::to_string(u.shape(0)) + ", " + std::to_string(u.shape(1)) + ")");
  return u;
}

py::tuple select(const Features& f, const py::handle& U, int64_t k, const py::object& ex_ids,
                 const py::object& ex_off, const py::object& allow, bool gumbel, double temperature,
                 uint64_t seed) {
  auto u = expect_queries(U, f);
  const int64_t Q = u.shape(0);
  if (k < 0) throw py::value_error("k must be >= 0; got " + std::to_string(k));
  if (k > f.n_items())  // before allocating Q x k outputs
    throw py::value_error("k=" + std::to_string(k) + " exceeds the " + std::to_string(f.n_items()) +
                          " items");
  Exclude ex = make_exclude(ex_ids, ex_off, Q, allow, f.n_items());
  py::array_t<float> s({Q, k});
  py::array_t<int64_t> idx({Q, k});
  float* ps = s.mutable_data();
  int64_t* pi = idx.mutable_data();
  const float* pu = u.data();
  {
    py::gil_scoped_release release;
    if (gumbel)
      f.sample_softmax(pu, Q, k, ex.lists, temperature, seed, ps, pi);
    else
      f.top_k(pu, Q, k, ex.lists, ps, pi);
  }
  return py::make_tuple(s, idx);
}

void check_vector(const py::array_t<double, py::array::c_style | py::array::forcecast>& v,
                  int64_t d, const char* what) {
  if (v.ndim() != 1 || v.shape(0) != d)
    throw std::invalid_argument(
        std::string(what) + " needs a vector of " + std::to_string(d) + " values; got " +
        std::to_string(v.ndim()) + " dims" +
        (v.ndim() >= 1 ? ", " + std::to_string(v.shape(0)) + " first" : std::string()));
}

// crossknn/prior.h: A v for float32 rows A (m x d) and v (d,), in double
py::array_t<double> rows_dot(
    const py::array_t<float, py::array::c_style | py::array::forcecast>& A,
    const py::array_t<double, py::array::c_style | py::array::forcecast>& v) {
  if (A.ndim() != 2) throw std::invalid_argument("rows_dot needs a 2-d matrix A (m x d)");
  const int64_t m = A.shape(0), d = A.shape(1);
  check_vector(v, d, "rows_dot");
  py::array_t<double> out(m);
  const float* a = A.data();
  const double* x = v.data();
  double* o = out.mutable_data();
  py::gil_scoped_release release;
  crossknn::rows_dot(a, m, d, x, o);
  return out;
}

// crossknn/prior.h: ||L^T v||^2 for L packed by columns
double packed_lower_t_norm2(
    const py::array_t<double, py::array::c_style | py::array::forcecast>& ap,
    const py::array_t<double, py::array::c_style | py::array::forcecast>& v) {
  if (v.ndim() != 1) throw std::invalid_argument("packed_lower_t_norm2 needs a vector v (d,)");
  const int64_t d = v.shape(0);
  if (ap.ndim() != 1 || ap.shape(0) != d * (d + 1) / 2)
    throw std::invalid_argument(
        "packed_lower_t_norm2 needs d (d + 1) / 2 = " + std::to_string(d * (d + 1) / 2) +
        " packed values for d = " + std::to_string(d));
  const double* a = ap.data();
  const double* x = v.data();
  py::gil_scoped_release release;
  return crossknn::packed_lower_t_norm2(a, d, x);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "crossknn C++ core (round engine)";
  bind_index(m);
  m.def("version", &crossknn::version, "Version of the C++ core.");
  m.def("kernel_name", &crossknn::kernel_name,
        "Kernel set in use: 'avx512', 'avx2' or 'generic' (CROSSKNN_SIMD=avx2 or generic, or "
        "CROSSKNN_NO_SIMD=1, forces an older set; every set gives the same bits).");

  m.def("query_seed", &crossknn::query_seed, py::arg("seed"), py::arg("query_id"),
        "crossknn.search.query_seed for integer ids, computed in C++.");
  m.def(
      "search_profile",
      [](bool reset) {
        const crossknn::SearchProfile p = crossknn::search_profile(reset);
        py::dict d;
        d["first"] = p.first;
        d["solve"] = p.solve;
        d["select"] = p.select;
        d["check"] = p.check;
        d["score"] = p.score;
        d["append"] = p.append;
        d["final"] = p.final;
        d["searches"] = p.searches;
        return d;
      },
      py::arg("reset") = false,
      "Seconds spent in each phase of run_search by this process (set CROSSKNN_PROFILE=1 before "
      "the first search; zeros otherwise); reset=True zeroes the totals after reading them.");
  m.def("rows_dot", &rows_dot, py::arg("A"), py::arg("v"),
        "A v in double for float32 rows A (m x d) and v (d,) (crossknn/prior.h): the calling "
        "thread, eight partial sums a row.");
  m.def("packed_lower_t_norm2", &packed_lower_t_norm2, py::arg("ap"), py::arg("v"),
        "||L^T v||^2 for a lower triangular L packed by columns (d (d + 1) / 2 values; "
        "crossknn/prior.h): the calling thread.");
  m.def("run_search", &run_search, py::arg("features"), py::arg("scorer"), py::arg("plan"),
        py::arg("query_ids"), py::kw_only(), py::arg("budget"), py::arg("k"),
        py::arg("strategy") = "topk", py::arg("temperature") = 1.0, py::arg("ridge") = 0.0,
        py::arg("refine") = 3, py::arg("jitter_rel") = 1e-10, py::arg("mix") = 0.0,
        py::arg("seed") = 0, py::arg("first_items") = py::none(), py::arg("priors") = py::none(),
        py::arg("score_alpha") = 1.0, py::arg("score_beta") = 0.0, py::arg("solve") = "lstsq",
        py::arg("inv_penalties") = py::none(), py::arg("penalty_decay") = 0.0,
        py::arg("final_retrieved") = false, py::arg("selector") = py::none(),
        py::arg("first_features") = py::none(), py::arg("first_queries") = py::none(),
        py::arg("first_vmax") = 0.0, py::arg("allow") = py::none(),
        py::arg("stop_threshold") = 0.0, py::arg("stop_trace") = false,
        "The C++ round loop (crossknn/search.h) for a batch of queries; scorer(queries, items) "
        "-> list of float arrays is called once per step with the GIL held. first_features / "
        "first_queries (float32 (Q, d)) / first_vmax: a dense first stage run by the loop (the "
        "top items of ItemFeatures.top_k), instead of first_items. allow: packed allow masks "
        "(uint64, mask_words(N) words: one for every query, or Q x words). stop_threshold > 0: "
        "a query stops before a step whose estimated chance of changing its top-k is below it "
        "(out['stopped']: 0 budget, 1 found, 2 allowed); stop_trace: out['stop_chance'] holds "
        "each query's estimate per step (NaN where none).");

  py::class_<Features, std::shared_ptr<Features>>(m, "Features",
                                                  "Item features V (N x d) in one storage type.")
      .def(py::init([](const py::handle& V, const std::string& storage, int threads) {
             auto v = expect<float>(V, "V", 2);
             const crossknn::Storage st = crossknn::parse_storage(storage);
             const int64_t n = v.shape(0), d = v.shape(1);
             if (n == 0 || d == 0)
               throw py::value_error("V must be non-empty (N x d with N, d > 0); got " +
                                     std::to_string(n) + " x " + std::to_string(d));
             const float* p = v.data();
             py::gil_scoped_release release;
             return std::make_shared<Features>(p, n, d, st, threads);
           }),
           py::arg("V"), py::kw_only(), py::arg("storage") = "float32", py::arg("threads") = 0)
      .def_static("view", &features_view, py::arg("V"), py::kw_only(),
                  py::arg("scales") = py::none(), py::arg("threads") = 0,
                  py::arg("check_finite") = true,
                  "Zero-copy Features over a C-contiguous float32 / float16 / int8 (+ scales) "
                  "array; the array is kept alive and must not change.")
      .def_static(
          "open_npy",
          [](const std::string& path, int threads, const std::string& scales_path,
             bool check_finite) {
            py::gil_scoped_release release;
            return std::make_shared<Features>(
                Features::open_npy(path, threads, scales_path, check_finite));
          },
          py::arg("path"), py::kw_only(), py::arg("threads") = 0, py::arg("scales_path") = "",
          py::arg("check_finite") = true,
          "Memory-maps a .npy item matrix (float32 / float16 / int8 + scales file), no copy.")
      .def_property_readonly("is_view", &Features::is_view)
      .def_property_readonly("n_items", &Features::n_items)
      .def_property_readonly("dim", &Features::dim)
      .def_property_readonly("nbytes", &Features::nbytes)
      .def_property_readonly("storage",
                             [](const Features& f) { return crossknn::storage_name(f.storage()); })
      .def_property("threads", &Features::threads, &Features::set_threads)
      .def_property("prefilter", &Features::prefilter, &Features::set_prefilter,
                    "top_k through a float16 copy with exact rescoring of the rows that can "
                    "reach the top k (float32 storage; same results as the full pass)")
      .def_property_readonly("prefilter_ready", &Features::prefilter_ready,
                             "whether the prefilter's float16 copy has been built")
      .def_property("gram", &Features::gram, &Features::set_gram,
                    "use the item Gram cache in least-squares rounds (same results; "
                    "crossknn/features.h)")
      .def(
          "prepare_gram",
          [](const Features& f, py::object inv) {
            if (inv.is_none()) {
              py::gil_scoped_release nogil;
              return f.prepare_gram();
            }
            auto a = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(inv);
            if (!a || a.ndim() != 1 || a.shape(0) < f.dim())
              throw py::value_error("inv must be a 1-D array of at least dim = " +
                                    std::to_string(f.dim()) + " inverse penalties");
            for (int64_t j = 0; j < f.dim(); ++j)
              if (!(a.data()[j] > 0.0) || !std::isfinite(a.data()[j]))
                throw py::value_error("inverse penalties must be finite and > 0");
            py::gil_scoped_release nogil;
            return f.prepare_gram(a.data());
          },
          py::arg("inv") = py::none(),
          "build the item Gram cache now (inv: the PriorRidge cache for these inverse "
          "penalties) if the matrix qualifies; True when it is ready")
      .def_property_readonly("gram_ready", &Features::gram_ready,
                             "whether the item Gram cache has been built")
      .def_property_readonly("gram_top_k_calls", &Features::gram_top_k_calls,
                             "round top-k calls (one query each) answered through the cache")
      .def("__repr__",
           [](const Features& f) {
             return "<crossknn._core.Features n_items=" + std::to_string(f.n_items()) +
                    " dim=" + std::to_string(f.dim()) +
                    " storage=" + crossknn::storage_name(f.storage()) + ">";
           })
      .def(
          "rows",
          [](const Features& f, const py::handle& items) {
            auto it = expect<int64_t>(items, "items", 1);
            const int64_t m = it.shape(0);
            py::array_t<double> out({m, f.dim()});
            double* po = out.mutable_data();
            const int64_t* pi = it.data();
            {
              py::gil_scoped_release release;
              f.rows(pi, m, po);
            }
            return out;
          },
          py::arg("items"))
      .def(
          "top_k",
          [](const Features& f, const py::handle& U, int64_t k, const py::object& ids,
             const py::object& off,
             const py::object& allow) { return select(f, U, k, ids, off, allow, false, 1.0, 0); },
          py::arg("u"), py::arg("k"), py::arg("exclude_ids") = py::none(),
          py::arg("exclude_offsets") = py::none(), py::arg("allow") = py::none())
      .def(
          "sample_softmax",
          [](const Features& f, const py::handle& U, int64_t k, const py::object& ids,
             const py::object& off, double temperature, uint64_t seed, const py::object& allow) {
            return select(f, U, k, ids, off, allow, true, temperature, seed);
          },
          py::arg("u"), py::arg("k"), py::arg("exclude_ids") = py::none(),
          py::arg("exclude_offsets") = py::none(), py::arg("temperature") = 1.0,
          py::arg("seed") = 0, py::arg("allow") = py::none())
      .def(
          "sample_random",
          [](const Features& f, int64_t Q, int64_t k, const py::object& ids, const py::object& off,
             uint64_t seed, const py::object& allow) {
            if (Q < 0) throw py::value_error("number of queries must be >= 0");
            if (k < 0) throw py::value_error("k must be >= 0; got " + std::to_string(k));
            if (k > f.n_items())
              throw py::value_error("k=" + std::to_string(k) + " exceeds the " +
                                    std::to_string(f.n_items()) + " items");
            check_result_size(Q, k, "sample_random");
            Exclude ex = make_exclude(ids, off, Q, allow, f.n_items());
            py::array_t<int64_t> idx({Q, k});
            int64_t* pi = idx.mutable_data();
            {
              py::gil_scoped_release release;
              f.sample_random(Q, k, ex.lists, seed, pi);
            }
            return idx;
          },
          py::arg("n_queries"), py::arg("k"), py::arg("exclude_ids") = py::none(),
          py::arg("exclude_offsets") = py::none(), py::arg("seed") = 0,
          py::arg("allow") = py::none());

  py::class_<LeastSquares>(m, "LeastSquares",
                           "Incremental least squares of one query (see crossknn.engine).")
      .def(py::init([](std::shared_ptr<Features> f, double ridge, int refine, double jitter) {
             if (!f) throw py::type_error("features must be a crossknn._core.Features");
             return std::make_unique<LeastSquares>(*f, ridge, refine, jitter);
           }),
           py::arg("features"), py::kw_only(), py::arg("ridge") = 0.0, py::arg("refine") = 3,
           py::arg("jitter_rel") = 1e-10, py::keep_alive<1, 2>())
      .def(
          "append",
          [](LeastSquares& s, const py::handle& items, const py::handle& targets) {
            auto it = expect<int64_t>(items, "items", 1);
            auto tg = expect<double>(targets, "targets", 1);
            if (it.shape(0) != tg.shape(0))
              throw py::value_error("items (" + std::to_string(it.shape(0)) + ") and targets (" +
                                    std::to_string(tg.shape(0)) + ") differ in length");
            const int64_t* pi = it.data();
            const double* pt = tg.data();
            const int64_t m = it.shape(0);
            py::gil_scoped_release release;
            s.append(pi, pt, m);
          },
          py::arg("items"), py::arg("targets"))
      .def("solve",
           [](const LeastSquares& s) {
             py::array_t<double> u(s.dim());
             double* pu = u.mutable_data();
             {
               py::gil_scoped_release release;
               s.solve(pu);
             }
             return u;
           })
      .def(
          "set_prior",
          [](LeastSquares& s, const py::object& prior, double mix) {
            if (prior.is_none()) {
              s.clear_prior();
              return;
            }
            auto p = expect<double>(prior, "prior", 1);
            if (p.shape(0) != s.dim())
              throw py::value_error("prior must have shape (" + std::to_string(s.dim()) +
                                    ",); got (" + std::to_string(p.shape(0)) + ",)");
            s.set_prior(p.data(), mix);
          },
          py::arg("prior"), py::arg("mix"))
      .def_property_readonly("items",
                             [](const LeastSquares& s) {
                               auto v = s.items();
                               py::array_t<int64_t> out(static_cast<py::ssize_t>(v.size()));
                               std::copy(v.begin(), v.end(), out.mutable_data());
                               return out;
                             })
      .def_property_readonly("targets",
                             [](const LeastSquares& s) {
                               auto v = s.targets();
                               py::array_t<double> out(static_cast<py::ssize_t>(v.size()));
                               std::copy(v.begin(), v.end(), out.mutable_data());
                               return out;
                             })
      .def_property_readonly("size", &LeastSquares::size)
      .def_property_readonly("dim", &LeastSquares::dim)
      .def_property_readonly("ridge", &LeastSquares::ridge)
      .def_property_readonly("primal", &LeastSquares::primal)
      .def_property_readonly("delta", &LeastSquares::delta);
}
