#pragma once
// The two products `auto`'s prior reads per query (crossknn.search.auto.AutoIndex): the row
// queries' DE vectors against the query's, and ||Lᵀ v|| for the item covariance's Cholesky
// factor. On the calling thread (no BLAS thread pool woken, and left spinning, for a few hundred
// kB a query); the same sums on every CPU.
#include <cstdint>

namespace crossknn {

// out[r] = A[r] . v in double for float32 rows A (m x d, row-major): eight partial sums per row,
// then ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)).
void rows_dot(const float* A, int64_t m, int64_t d, const double* v, double* out);

// ||Lᵀ v||² for a lower triangular L (d x d) packed by columns (column j holds L[j:, j]: d (d + 1)
// / 2 values): (Lᵀ v)_j = L[j:, j] . v[j:], each with rows_dot's sums.
double packed_lower_t_norm2(const double* ap, int64_t d, const double* v);

}  // namespace crossknn
