// pybind11 bindings for the C++ core: numpy in, numpy out; no logic here.
#include <pybind11/pybind11.h>

#include "crossknn/version.h"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
  m.doc() = "crossknn C++ core (round engine)";
  m.def("version", &crossknn::version, "Version of the C++ core.");
}
