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

// One dot product a . b over n entries with eight partial sums and the Pairwise reduction (a
// float32 `a` widened to double first: the bits of the same sum over its double copy). Inline,
// so a caller's own vector clones (clones.h) vectorize it.
template <class T>
inline double dot_pairwise(const T* a, const double* b, int64_t n) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) s[l] += static_cast<double>(a[j + l]) * b[j + l];
  for (; j < n; ++j) s[0] += static_cast<double>(a[j]) * b[j];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// out[t] = a[t] . b over n entries, t < na (1 <= na <= 4).
void dots(DotOrder order, const double* const* a, int na, const double* b, int64_t n,
          double* out);

// out0[t] = a[t] . b0 and out1[t] = a[t] . b1 (1 <= na <= 4): two dots() calls' results, bit for
// bit; with AVX-512 the two vectors share each pass over `a` (twice the independent sums).
void dots2v(DotOrder order, const double* const* a, int na, const double* b0, const double* b1,
            int64_t n, double* out0, double* out1);

// The same for float32 vectors (the products and sums in double, as dots() on the same values).
void dots_f(DotOrder order, const float* const* a, int na, const float* b, int64_t n,
            double* out);

// Gram entries of float32 rows x_r = X + r * ld (n entries each): out[(i - i0) * ldo + j] =
// x_i . x_j for i in [i0, i1) and j < min(j1, i) (nothing else is written), each with the
// operations of dots_f (the same bits). With AVX-512: FMAs on the values in double (a product of
// two floats is exact in double, so fma(a, b, s) == s + a * b), blocks of 16 rows x 2 rows in
// registers, the columns in L1-sized chunks.
void gram_rows_f(DotOrder order, const float* X, int64_t ld, int64_t n, int64_t i0, int64_t i1,
                 int64_t j1, double* out, int64_t ldo);

// Upper triangle of G = X^T X (X: m x d row-major holding float32 values, G: d x d row-major,
// zeroed by the caller) for rows i < returned value (a multiple of 4; 0 without AVX):
// G_ij += x_ti * x_tj for t in order, each a multiply then an add, as axpy row updates would do
// them (AVX-512: an FMA, the same value as the product is exact). Entries left of the diagonal
// inside a tile are written too (the caller ignores them).
// `threads`: blocks of four rows on up to that many threads (AVX-512 path; same results).
int64_t gram_tiles(const double* X, int64_t m, int64_t d, double* G, int threads = 1);

// Rows i0 .. i0+3 of a right-looking Cholesky in place (R: d x d row-major, rows k < i0 final
// and scaled): R_ij += (-r_ki) r_kj for every k < i0 in order, j >= i (entries left of the
// diagonal in the block are written too). false (nothing done) without AVX or past the end.
bool chol_block_update(const double* R, int64_t d, int64_t i0, double* G);

// The single dot product of that order (what dots() equals).
double dot1(DotOrder order, const double* a, const double* b, int64_t n);

}  // namespace crossknn::detail
