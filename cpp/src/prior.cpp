// auto's prior products (crossknn/prior.h).
#include "crossknn/prior.h"

#include "clones.h"

namespace crossknn {
namespace {

// eight partial sums (the compiler may not reorder one sum; -ffp-contract=off: no fused
// multiply-adds), so every clone gives the same bits
template <class T>
inline double dot8(const T* a, const double* b, int64_t n) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) s[l] += static_cast<double>(a[j + l]) * b[j + l];
  for (; j < n; ++j) s[0] += static_cast<double>(a[j]) * b[j];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

}  // namespace

CROSSKNN_CLONES_AVX512 void rows_dot(const float* A, int64_t m, int64_t d, const double* v,
                                     double* out) {
  for (int64_t r = 0; r < m; ++r) out[r] = dot8(A + r * d, v, d);
}

CROSSKNN_CLONES_AVX512 double packed_lower_t_norm2(const double* ap, int64_t d, const double* v) {
  double total = 0.0;
  int64_t off = 0;
  for (int64_t j = 0; j < d; ++j) {
    const double t = dot8(ap + off, v + j, d - j);
    total += t * t;
    off += d - j;
  }
  return total;
}

}  // namespace crossknn
