// auto's prior products (crossknn/prior.h): dot_pairwise (dots.h) row by row, in the core's
// vector clones (-ffp-contract=off: every clone the same bits).
#include "crossknn/prior.h"

#include "clones.h"
#include "dots.h"

namespace crossknn {

CROSSKNN_CLONES_AVX512 void rows_dot(const float* A, int64_t m, int64_t d, const double* v,
                                     double* out) {
  for (int64_t r = 0; r < m; ++r) out[r] = detail::dot_pairwise(A + r * d, v, d);
}

CROSSKNN_CLONES_AVX512 double packed_lower_t_norm2(const double* ap, int64_t d, const double* v) {
  double total = 0.0;
  int64_t off = 0;
  for (int64_t j = 0; j < d; ++j) {
    const double t = detail::dot_pairwise(ap + off, v + j, d - j);
    total += t * t;
    off += d - j;
  }
  return total;
}

}  // namespace crossknn
