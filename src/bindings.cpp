// pybind11 bindings for the C++ core: numpy in, numpy out; no logic here.
// Every array argument is checked (type, dtype, C order, shape) before any pointer is taken;
// outputs are allocated under the GIL and the GIL is released around every kernel. C++
// exceptions are translated by pybind11: invalid_argument/length_error -> ValueError,
// out_of_range -> IndexError, bad_alloc -> MemoryError.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "crossknn/engine.h"
#include "crossknn/version.h"

namespace py = pybind11;
using crossknn::ExcludeLists;
using crossknn::Features;
using crossknn::LeastSquares;

namespace {

template <class T>
const char* dtype_name();
template <>
const char* dtype_name<float>() { return "float32"; }
template <>
const char* dtype_name<double>() { return "float64"; }
template <>
const char* dtype_name<int64_t>() { return "int64"; }

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
    throw py::value_error(std::string(name) + " must be " + std::to_string(ndim) +
                          "-D; got " + std::to_string(arr.ndim()) + "-D");
  if (!(arr.flags() & py::array::c_style))
    throw py::value_error(std::string(name) + " must be C-contiguous");
  return py::array_t<T, py::array::c_style>::ensure(arr);
}

struct Exclude {
  py::array_t<int64_t, py::array::c_style> ids, offsets;
  ExcludeLists lists;
};

Exclude make_exclude(const py::object& ids, const py::object& offsets, int64_t Q) {
  Exclude e;
  if (ids.is_none() != offsets.is_none())
    throw py::value_error("exclude ids and offsets must both be given or both be None");
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
    throw py::value_error("u must have shape (Q, d) with d=" + std::to_string(f.dim()) +
                          "; got (" + std::to_string(u.shape(0)) + ", " +
                          std::to_string(u.shape(1)) + ")");
  return u;
}

py::tuple select(const Features& f, const py::handle& U, int64_t k, const py::object& ex_ids,
                 const py::object& ex_off, bool gumbel, double temperature, uint64_t seed) {
  auto u = expect_queries(U, f);
  const int64_t Q = u.shape(0);
  if (k < 0) throw py::value_error("k must be >= 0; got " + std::to_string(k));
  if (k > f.n_items())  // before allocating Q x k outputs
    throw py::value_error("k=" + std::to_string(k) + " exceeds the " +
                          std::to_string(f.n_items()) + " items");
  Exclude ex = make_exclude(ex_ids, ex_off, Q);
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

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "crossknn C++ core (round engine)";
  m.def("version", &crossknn::version, "Version of the C++ core.");
  m.def("kernel_name", &crossknn::kernel_name,
        "Score kernel set in use: 'avx2' or 'generic' (CROSSKNN_NO_SIMD=1 forces 'generic').");

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
      .def_property_readonly("n_items", &Features::n_items)
      .def_property_readonly("dim", &Features::dim)
      .def_property_readonly("nbytes", &Features::nbytes)
      .def_property_readonly("storage",
                             [](const Features& f) { return crossknn::storage_name(f.storage()); })
      .def_property("threads", &Features::threads, &Features::set_threads)
      .def("__repr__",
           [](const Features& f) {
             return "<crossknn._core.Features n_items=" + std::to_string(f.n_items()) +
                    " dim=" + std::to_string(f.dim()) + " storage=" +
                    crossknn::storage_name(f.storage()) + ">";
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
             const py::object& off) { return select(f, U, k, ids, off, false, 1.0, 0); },
          py::arg("u"), py::arg("k"), py::arg("exclude_ids") = py::none(),
          py::arg("exclude_offsets") = py::none())
      .def(
          "sample_softmax",
          [](const Features& f, const py::handle& U, int64_t k, const py::object& ids,
             const py::object& off, double temperature, uint64_t seed) {
            return select(f, U, k, ids, off, true, temperature, seed);
          },
          py::arg("u"), py::arg("k"), py::arg("exclude_ids") = py::none(),
          py::arg("exclude_offsets") = py::none(), py::arg("temperature") = 1.0,
          py::arg("seed") = 0)
      .def(
          "sample_random",
          [](const Features& f, int64_t Q, int64_t k, const py::object& ids,
             const py::object& off, uint64_t seed) {
            if (Q < 0) throw py::value_error("number of queries must be >= 0");
            if (k < 0) throw py::value_error("k must be >= 0; got " + std::to_string(k));
            if (k > f.n_items())
              throw py::value_error("k=" + std::to_string(k) + " exceeds the " +
                                    std::to_string(f.n_items()) + " items");
            Exclude ex = make_exclude(ids, off, Q);
            py::array_t<int64_t> idx({Q, k});
            int64_t* pi = idx.mutable_data();
            {
              py::gil_scoped_release release;
              f.sample_random(Q, k, ex.lists, seed, pi);
            }
            return idx;
          },
          py::arg("n_queries"), py::arg("k"), py::arg("exclude_ids") = py::none(),
          py::arg("exclude_offsets") = py::none(), py::arg("seed") = 0);

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
