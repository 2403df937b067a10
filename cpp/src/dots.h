#pragma once
// Internal: several dot products against one vector at once, each with exactly the operations of
// the solvers' single dot products (eight partial sums, then a fixed reduction), so that results
// are bit for bit those of one dot at a time. Sharing the loads of `b` (and running the groups on
// threads) is what makes the Gram rows and triangular solves of the incremental solvers fast.
#include <cstdint>

namespace crossknn::detail {

// Reduction order of the eight partial sums.
enum class DotOrder {
  Interleaved,  // ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7)): least_squares (lstsq.cpp)
  Pairwise,     // ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)): PriorRidge (search.cpp)
};

// out[t] = a[t] . b over n entries, t < na (1 <= na <= 4).
void dots(DotOrder order, const double* const* a, int na, const double* b, int64_t n,
          double* out);

// The same for float32 vectors (the products and sums in double, as dots() on the same values).
void dots_f(DotOrder order, const float* const* a, int na, const float* b, int64_t n,
            double* out);

// The single dot product of that order (what dots() equals).
double dot1(DotOrder order, const double* a, const double* b, int64_t n);

}  // namespace crossknn::detail
