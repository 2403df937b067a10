#pragma once
// Internal: the stored item matrix behind a Features handle, and raw access for the kernels.
// Not installed; nothing outside cpp/src includes it.
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "crossknn/features.h"
#include "huge_pages.h"

namespace crossknn::detail {

struct Shadow;
struct Shadow8;
struct ItemGram;
struct WeightedGram;

struct FeatureData {
  int64_t n = 0, d = 0;
  Storage st = Storage::Float32;
  // what the kernels read: owned vectors below, caller memory, or a file map kept by `owner`
  const float* p32 = nullptr;
  const uint16_t* p16 = nullptr;
  const int8_t* p8 = nullptr;
  const float* pscale = nullptr;
  HugeVector<float> own32;  // the passes' data: huge pages where offered (huge_pages.h)
  HugeVector<uint16_t> own16;
  HugeVector<int8_t> own8;
  std::vector<float> own_scale;
  std::shared_ptr<const void> owner;
  bool view = false;
  // the prefilter's int8 copy, built once (on the second top_k call) and shared by all handles
  mutable std::once_flag shadow_once;
  mutable std::unique_ptr<const Shadow> shadow;
  mutable std::atomic<int64_t> topk_calls{0};
  mutable std::atomic<bool> shadow_ready{false};
  mutable std::once_flag shadow8_once;
  mutable std::unique_ptr<const Shadow8> shadow8;
  mutable std::atomic<int> int8_misses{0};  // calls where the int8 copy left too many rows
  mutable std::atomic<int64_t> narrowed{0};  // queries whose int8 candidates float16 narrowed
  // the item Gram cache of the least-squares rounds (gram.h), built once and shared
  mutable std::once_flag gram_once;
  mutable std::unique_ptr<const ItemGram> gram;
  mutable std::atomic<bool> gram_ready{false};
  mutable std::atomic<int64_t> ls_searches{0};  // searches with least-squares rounds
  mutable std::atomic<int64_t> gram_topk{0};    // query top-k calls the cache answered
  // the same for the PriorRidge solve's kernel entries (one inverse-penalty vector)
  mutable std::once_flag wgram_once;
  mutable std::unique_ptr<const WeightedGram> wgram;
  mutable std::atomic<bool> wgram_ready{false};

  int64_t dim() const noexcept { return d; }
  Storage storage() const noexcept { return st; }
  const float* f32() const noexcept { return p32; }
  const uint16_t* f16() const noexcept { return p16; }
  const int8_t* i8() const noexcept { return p8; }
  const float* scales() const noexcept { return pscale; }
};

// A float16 copy of a float32 matrix for the top-k prefilter (features.cpp): x = v / col_scale
// (col_scale: powers of two, exact) rounded to float16, and per row a bound on the distance of
// the float16 score from the exact one, per unit of ||u col_scale||.
struct Shadow {
  HugeVector<uint16_t> h;
  std::vector<double> col_scale, err_norm;
  double max_norm = 0.0;  // >= max over rows of ||x||
};

// An int8 copy of a float32 matrix for the top-k prefilter (features.cpp): x = v / col_scale
// (powers of two), q = round(x / scale) per row (scale = max|x| / 127, double), and per row
// ||q scale||, ||x - q scale|| (+ margin) and gamma ||x||, rounded up. Columns holding one nonzero
// value in every row (e.g. a bias column) are left out of q (q = 0 there) and enter the scores
// exactly (const_x: their x, 0 elsewhere): a large query weight on them then does not multiply
// the quantization error of the other columns.
struct Shadow8 {
  HugeVector<int8_t> q;
  std::vector<double> col_scale, scale, dq_norm, err_norm, gx_norm, const_x;
  std::vector<int64_t> const_cols;
  double max_norm = 0.0;  // >= max over rows of ||x||
};

// G = V V^T of a float32 matrix (gram.h): g is N x N row-major, g[i N + j] = x_i . x_j with the
// operations of the least-squares solver's own Gram entries (dots_f, DotOrder::Interleaved: the
// same bits, and symmetric as the products are exact); norm[i] >= ||x_i|| (rounded up).
struct ItemGram {
  HugeVector<double> g;  // read at random: huge pages (huge_pages.h)
  std::vector<double> norm;
};

// M = (V diag(inv)) V^T for the PriorRidge solve (gram.h): m is N x N row-major, m[i N + j] =
// dots(Pairwise, x_i o inv, x_j) over the d columns (the solve's own bits; not symmetric).
struct WeightedGram {
  std::vector<double> inv;
  HugeVector<double> m;
};

}  // namespace crossknn::detail
