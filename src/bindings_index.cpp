// pybind11 bindings of crossknn/auto_index.h (auto's features and prior: the one copy Python's
// crossknn.search.auto and the C++ Searcher both run) and crossknn/searcher.h (the C++ search of
// an index folder, for tests and benchmarks against Python's Searcher). Numpy in, numpy out.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "crossknn/auto_index.h"
#include "crossknn/index.h"
#include "crossknn/searcher.h"

namespace py = pybind11;

namespace {

template <class T>
using carr = py::array_t<T, py::array::c_style | py::array::forcecast>;

template <class T>
carr<T> need(const py::handle& obj, const char* what, int ndim) {
  carr<T> a = py::cast<carr<T>>(obj);
  if (a.ndim() != ndim)
    throw py::value_error(std::string(what) + " must have " + std::to_string(ndim) +
                          " dimensions; got " + std::to_string(a.ndim()));
  return a;
}

// A CE stand-in over one row of N scores (no Python call: the GIL is released)
class RowScorer final : public crossknn::Scorer {
 public:
  explicit RowScorer(const float* row) : row_(row) {}
  void score(int64_t, const int64_t* items, int64_t m, float* out) override {
    for (int64_t t = 0; t < m; ++t) out[t] = row_[items[t]];
  }

 private:
  const float* row_;
};

// A Python callable items (int64 array) -> scores, called with the GIL held
class CallScorer final : public crossknn::Scorer {
 public:
  explicit CallScorer(py::function fn) : fn_(std::move(fn)) {}
  void score(int64_t, const int64_t* items, int64_t m, float* out) override {
    py::gil_scoped_acquire gil;
    py::array_t<int64_t> it(m, items);
    carr<float> s = py::cast<carr<float>>(fn_(it));
    if (s.size() != m)
      throw std::invalid_argument("the scorer returned " + std::to_string(s.size()) +
                                  " scores for " + std::to_string(m) + " items");
    std::copy(s.data(), s.data() + m, out);
  }

 private:
  py::function fn_;
};

std::shared_ptr<crossknn::AutoPrior> make_prior(int64_t d, int64_t m, int64_t r,
                                                const py::object& W, const py::object& deltas,
                                                double alpha, double tau, double ridge,
                                                double kernel_tau, const py::object& cov,
                                                const py::object& V, const py::object& chol) {
  crossknn::AutoPriorSpec s;
  s.d = d;
  s.m = m;
  s.r = r;
  s.alpha = alpha;
  s.tau = tau;
  s.ridge = ridge;
  s.kernel_tau = kernel_tau;
  carr<float> w, dl, v;
  carr<double> c, ch;
  if (!W.is_none()) {
    w = need<float>(W, "W", 2);
    if (w.shape(0) > 0 && w.shape(1) != d) throw py::value_error("W must be (P x d)");
    s.W = w.data();
    s.P = w.shape(0);
  }
  if (!deltas.is_none()) {
    dl = need<float>(deltas, "deltas", 2);
    if (dl.shape(0) != s.P || dl.shape(1) != d + m + r + 1)
      throw py::value_error("deltas must be (P x (d + m + r + 1))");
    s.deltas = dl.data();
  }
  if (!cov.is_none()) {
    c = need<double>(cov, "cov", 2);
    if (c.shape(0) != d || c.shape(1) != d) throw py::value_error("cov must be (d x d)");
    s.cov = c.data();
  }
  if (!V.is_none()) {
    v = need<float>(V, "V", 2);
    if (v.shape(1) != d) throw py::value_error("V must be (N x d)");
    s.V = v.data();
    s.n = v.shape(0);
  }
  if (!chol.is_none()) {
    ch = need<double>(chol, "chol", 1);
    if (ch.shape(0) != d * (d + 1) / 2) throw py::value_error("chol must hold d (d + 1) / 2 values");
    s.chol = ch.data();
  }
  py::gil_scoped_release release;
  return std::make_shared<crossknn::AutoPrior>(s);
}

carr<double> vec(const py::handle& v, int64_t d, const char* what) {
  carr<double> a = need<double>(v, what, 1);
  if (a.shape(0) != d)
    throw py::value_error(std::string(what) + " must have " + std::to_string(d) + " values; got " +
                          std::to_string(a.shape(0)));
  return a;
}

}  // namespace

void bind_index(py::module_& m) {
  m.def(
      "auto_features",
      [](const py::handle& V, const py::handle& R, const py::handle& A) {
        auto v = need<float>(V, "V", 2);
        auto r = need<float>(R, "R", 2);
        auto a = need<float>(A, "A", 2);
        const int64_t n = v.shape(0), d = v.shape(1), mm = r.shape(0), k = a.shape(1);
        if (mm > 0 && r.shape(1) != n) throw py::value_error("R must be (m x N)");
        if (k > 0 && a.shape(0) != d) throw py::value_error("A must be (d x r)");
        std::vector<float> X;
        {
          py::gil_scoped_release release;
          X = crossknn::auto_features(v.data(), n, d, r.data(), mm, a.data(), k);
        }
        py::array_t<float> out({n, d + mm + k + 1});
        std::copy(X.begin(), X.end(), out.mutable_data());
        return out;
      },
      py::arg("V"), py::arg("R"), py::arg("A"),
      "auto's item features [V | zrows(R)^T | V A | 1] as float32 (crossknn/auto_index.h).");
  m.def(
      "item_covariance",
      [](const py::handle& V) {
        auto v = need<float>(V, "V", 2);
        const int64_t n = v.shape(0), d = v.shape(1);
        std::vector<double> C;
        {
          py::gil_scoped_release release;
          C = crossknn::item_covariance(v.data(), n, d);
        }
        py::array_t<double> out({d, d});
        std::copy(C.begin(), C.end(), out.mutable_data());
        return out;
      },
      py::arg("V"), "The population covariance (d x d, float64) of the rows of V.");
  m.def(
      "packed_cholesky",
      [](const py::handle& C) -> py::object {
        auto c = need<double>(C, "C", 2);
        const int64_t d = c.shape(0);
        if (c.shape(1) != d) throw py::value_error("C must be square");
        std::vector<double> L;
        bool ok;
        {
          py::gil_scoped_release release;
          ok = crossknn::packed_cholesky(c.data(), d, L);
        }
        if (!ok) return py::none();
        py::array_t<double> out(static_cast<py::ssize_t>(L.size()));
        std::copy(L.begin(), L.end(), out.mutable_data());
        return std::move(out);
      },
      py::arg("C"),
      "C's Cholesky factor packed by columns, or None when C is not positive definite.");
  py::class_<crossknn::AutoPrior, std::shared_ptr<crossknn::AutoPrior>>(
      m, "AutoPrior", "auto's prior of a query (crossknn/auto_index.h).")
      .def(py::init(&make_prior), py::arg("d"), py::arg("m"), py::arg("r"), py::kw_only(),
           py::arg("W") = py::none(), py::arg("deltas") = py::none(), py::arg("alpha") = 0.0,
           py::arg("tau") = 10.0, py::arg("ridge") = 0.0, py::arg("kernel_tau") = 2.0,
           py::arg("cov") = py::none(), py::arg("V") = py::none(), py::arg("chol") = py::none())
      .def_property_readonly("width", &crossknn::AutoPrior::width)
      .def_property_readonly("uses_tables", &crossknn::AutoPrior::uses_tables)
      .def("prior",
           [](const crossknn::AutoPrior& p, const py::handle& v) {
             auto x = vec(v, p.dim(), "v");
             py::array_t<double> out(p.width());
             double* o = out.mutable_data();
             py::gil_scoped_release release;
             p.prior(x.data(), o);
             return out;
           })
      .def("spread",
           [](const crossknn::AutoPrior& p, const py::handle& v) {
             auto x = vec(v, p.dim(), "v");
             return p.spread(x.data());
           })
      .def_property_readonly("covariance",
                             [](const crossknn::AutoPrior& p) {
                               const auto& c = p.covariance();
                               const py::ssize_t d = p.dim();
                               py::array_t<double> out({c.empty() ? 0 : d, c.empty() ? 0 : d});
                               std::copy(c.begin(), c.end(), out.mutable_data());
                               return out;
                             })
      .def_property_readonly("cholesky", [](const crossknn::AutoPrior& p) -> py::object {
        const auto& c = p.cholesky();
        if (c.empty()) return py::none();
        py::array_t<double> out(static_cast<py::ssize_t>(c.size()));
        std::copy(c.begin(), c.end(), out.mutable_data());
        return std::move(out);
      });

  py::class_<crossknn::Searcher, std::shared_ptr<crossknn::Searcher>>(
      m, "IndexSearcher",
      "The C++ search of an index folder (crossknn/searcher.h): crossknn::Index::open + "
      "crossknn::Searcher, for comparing with crossknn.Searcher.")
      .def(py::init([](const std::string& path, const std::string& round_index, double mix,
                       int threads, bool verify) {
             py::gil_scoped_release release;
             crossknn::SearcherOptions o;
             o.round_index = round_index;
             o.mix = mix;
             o.threads = threads;
             return std::make_shared<crossknn::Searcher>(crossknn::Index::open(path, verify), o);
           }),
           py::arg("path"), py::kw_only(), py::arg("round_index") = "auto", py::arg("mix") = 0.5,
           py::arg("threads") = 0, py::arg("verify") = true)
      .def_property_readonly("n_items", [](const crossknn::Searcher& s) { return s.index().n_items(); })
      .def_property_readonly("version", [](const crossknn::Searcher& s) { return s.index().version(); })
      .def_property_readonly("n_removed", [](const crossknn::Searcher& s) { return s.index().n_removed(); })
      .def_property_readonly("ids", [](const crossknn::Searcher& s) { return s.index().ids(); })
      .def_property_readonly("methods", [](const crossknn::Searcher& s) { return s.index().methods(); })
      .def_property_readonly("default_method",
                             [](const crossknn::Searcher& s) { return s.index().default_method(); })
      .def(
          "plan",
          [](const crossknn::Searcher& s, const std::string& method, int64_t budget, int64_t rounds) {
            std::vector<int64_t> out;
            for (const auto& st : s.plan(method, budget, rounds)) out.push_back(st.n);
            return out;
          },
          py::arg("method") = "", py::arg("budget") = 100, py::arg("rounds") = 0)
      .def(
          "search",
          [](const crossknn::Searcher& s, const py::handle& query_vector, const py::object& scores,
             int64_t k, int64_t budget, const std::string& method, int64_t rounds, uint64_t seed,
             uint64_t query_id, const py::object& allow, double target_recall) {
            const crossknn::Index& ix = s.index();
            auto q = need<float>(query_vector, "query_vector", 1);
            if (q.shape(0) != ix.dim())
              throw py::value_error("query_vector must have " + std::to_string(ix.dim()) + " values");
            crossknn::SearchRequest req;
            req.query_vector = q.data();
            req.k = k;
            req.budget = budget;
            req.method = method;
            req.rounds = rounds;
            req.seed = seed;
            req.query_id = query_id;
            req.target_recall = target_recall;
            std::vector<uint64_t> words;
            if (!allow.is_none()) {
              auto a = py::cast<py::array_t<bool, py::array::c_style>>(allow);
              if (a.ndim() != 1 || a.shape(0) != ix.n_items())
                throw py::value_error("allow must be a boolean array (N,)");
              words.assign(static_cast<size_t>(crossknn::mask_words(ix.n_items())), 0);
              for (int64_t i = 0; i < ix.n_items(); ++i)
                if (a.data()[i]) words[i >> 6] |= uint64_t{1} << (i & 63);
              req.allow = words.data();
            }
            crossknn::Hits h;
            const auto t0 = std::chrono::steady_clock::now();
            if (py::isinstance<py::function>(scores)) {
              CallScorer sc(py::cast<py::function>(scores));
              py::gil_scoped_release release;
              h = s.search(sc, req);
            } else {
              auto row = need<float>(scores, "scores", 1);
              if (row.shape(0) != ix.n_items())
                throw py::value_error("scores must hold one CE score per item");
              RowScorer sc(row.data());
              py::gil_scoped_release release;
              h = s.search(sc, req);
            }
            const double secs =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            py::dict out;
            out["indices"] = py::array_t<int64_t>(static_cast<py::ssize_t>(h.indices.size()), h.indices.data());
            out["scores"] = py::array_t<float>(static_cast<py::ssize_t>(h.scores.size()), h.scores.data());
            out["ce_calls"] = h.ce_calls;
            out["allowed"] = h.allowed;
            out["seconds"] = secs;
            out["stopped"] = h.stopped;
            return out;
          },
          py::arg("query_vector"), py::arg("scores"), py::kw_only(), py::arg("k") = 10,
          py::arg("budget") = 100, py::arg("method") = "", py::arg("rounds") = 0,
          py::arg("seed") = 0, py::arg("query_id") = 0, py::arg("allow") = py::none(),
          py::arg("target_recall") = 0.0,
          "One query: its DE vector and its CE (a float32 row of N scores, or a callable items "
          "-> scores); returns indices, scores, ce_calls, allowed (-1: every item) and seconds.");
}
