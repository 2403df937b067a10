#pragma once
// crossknn/features.h: item features V (N x d) in one storage type, with streaming top-k,
// Gumbel-top-k (SoftMax) sampling and uniform random sampling over the items a query has not
// scored yet.
//
// Errors are std exceptions: std::invalid_argument for bad values or shapes, std::out_of_range
// for item ids outside [0, N), std::length_error for sizes that overflow, std::runtime_error for
// files that cannot be opened or read, std::bad_alloc when memory runs out. Nothing aborts.
//
// Ownership. A Features object is a cheap handle (copy = shared reference, no data copied) to an
// immutable matrix that is either owned (the copying constructor), a view of memory the caller
// owns (view_*: the caller keeps it alive and unchanged while any handle exists, or passes an
// `owner` that does), or a read-only memory map of a .npy file (open_npy; the map lives as long
// as the last handle).
//
// Threads. All const calls (top_k, sample_*, rows, accessors) may run concurrently on one object
// and on copies of it; each call also uses up to threads() worker threads internally, and its
// results never depend on that number. set_threads() must not run concurrently with any other
// call on the same handle (copies have their own thread count).

#include <cstdint>
#include <memory>
#include <string>

namespace crossknn {

enum class Storage { Float32, Float16, Int8 };

Storage parse_storage(const std::string& name);  // "float32" | "float16" | "int8"
const char* storage_name(Storage s) noexcept;
// Kernel set in use: "avx512", "avx2" or "generic" (chosen once per process from the CPU;
// CROSSKNN_SIMD=avx2 caps it at the AVX2 kernels, CROSSKNN_NO_SIMD=1 or CROSSKNN_SIMD=generic
// forces "generic"). Results are the same bits on every set, except float32 / float16 scores
// on the generic path (last bits).
const char* kernel_name() noexcept;

// An allow mask over N items: one bit per item, item i in bit (i % 64) of word i / 64
// (mask_words(N) words; bits from N on are ignored). A disallowed item is never chosen.
inline int64_t mask_words(int64_t n) noexcept { return (n + 63) / 64; }
inline bool mask_allows(const uint64_t* words, int64_t i) noexcept {
  return words == nullptr || ((words[i >> 6] >> (i & 63)) & 1u) != 0;
}
// The allowed items among the first n (every item for a null mask).
int64_t mask_count(const uint64_t* words, int64_t n) noexcept;

// Which items Q queries may not choose: exclusion lists in CSR form (ids of query q are
// ids[offsets[q] .. offsets[q+1]); entries equal to -1 are padding and ignored; other ids must
// lie in [0, N); duplicates are fine) and allow masks (allow[q]: query q's mask, mask_words(N)
// words; a null allow, or a null entry, allows every item). An item is available to query q
// when its mask allows it and its list does not hold it.
struct ExcludeLists {
  const int64_t* ids = nullptr;
  const int64_t* offsets = nullptr;        // Q + 1 entries, or nullptr for "no exclusion"
  const uint64_t* const* allow = nullptr;  // Q mask pointers, or nullptr for "every item"
  const uint64_t* allow_of(int64_t q) const noexcept { return allow ? allow[q] : nullptr; }
};

class Features;
namespace detail {
struct FeatureData;  // the stored matrix (private: cpp/src/features_impl.h)
const FeatureData& data(const Features& f) noexcept;
}  // namespace detail

class Features {
 public:
  // V: n x d row-major float32, copied and converted to `storage` (int8: per-row scale
  // max|v|/127, q = round-to-nearest-even(v / scale) clamped to [-127, 127]; zero rows get
  // scale 1). threads = 0 means std::thread::hardware_concurrency(). V must be finite.
  Features(const float* V, int64_t n, int64_t d, Storage storage, int threads = 0);

  // Zero-copy views (no conversion, nothing copied). `owner` (optional) is kept alive as long
  // as any handle to the view exists; without one the caller keeps the memory alive. With
  // check_finite the matrix is read once to refuse NaN/inf (float32, float16) or bad scales.
  // The memory must stay unchanged while the view is used.
  static Features view_float32(const float* V, int64_t n, int64_t d, int threads = 0,
                               std::shared_ptr<const void> owner = nullptr,
                               bool check_finite = true);
  // IEEE binary16 bit patterns
  static Features view_float16(const uint16_t* V, int64_t n, int64_t d, int threads = 0,
                               std::shared_ptr<const void> owner = nullptr,
                               bool check_finite = true);
  // int8 rows q (n x d) with one float32 scale per row (> 0, finite): v_ij = q_ij * scale_i.
  static Features view_int8(const int8_t* V, const float* scales, int64_t n, int64_t d,
                            int threads = 0, std::shared_ptr<const void> owner = nullptr,
                            bool check_finite = true);

  // Memory-maps a .npy item matrix read-only (2-D, C order, little-endian; '<f4' float32,
  // '<f2' float16 or '|i1' int8). int8 needs `scales_path`: a .npy of n float32 row scales
  // (e.g. ITEMS.scales.npy written next to ITEMS.npy). The storage follows the file's dtype.
  // Pages are read on demand by the kernels; nothing is copied. POSIX only.
  static Features open_npy(const std::string& path, int threads = 0,
                           const std::string& scales_path = "", bool check_finite = true);

  int64_t n_items() const noexcept;
  int64_t dim() const noexcept;
  Storage storage() const noexcept;
  int threads() const noexcept { return threads_; }
  void set_threads(int threads);
  // Top-k prefilter (float32 storage; on by default, CROSSKNN_NO_PREFILTER=1 turns the default
  // off): top_k first scores a float16 copy of V (columns scaled by powers of two; built once,
  // on the second top_k call, and kept with the matrix: N x d x 2 bytes + 8 bytes a row), bounds
  // each exact score's distance from it (float16 rounding + the float32 rounding of both
  // kernels, Cauchy-Schwarz), and computes exact scores only for the rows whose upper bound
  // reaches the k-th largest lower bound. The result is identical to the full pass (same items,
  // same float bits); only the work changes. Not used for k > N / 4 or sample_softmax.
  void set_prefilter(bool on) noexcept { prefilter_ = on; }
  bool prefilter() const noexcept { return prefilter_; }
  bool prefilter_ready() const noexcept;  // the float16 copy exists (shared by all handles)
  // Item Gram caches of the least-squares rounds (cpp/src/gram.h): G = V V^T in double (N^2 x 8
  // bytes, shared by all handles) for search() with Solve::LeastSquares, and M = (V diag(inv))
  // V^T for the PriorRidge solve with inverse penalties inv (its first d values); float32
  // matrices with d >= 128 and N^2 x 8 bytes <= CROSSKNN_GRAM_MB MiB (default 256; 0 turns them
  // off). G is built by prepare_gram() or on its own once max(64, N / 8) least-squares searches
  // have run on the matrix (about where its build time is paid back); M only by
  // prepare_gram(inv) (its gain per search is small next to its build). With G the solver's Gram
  // entries are lookups and a round's top-k, while a query has scored at most d / 8 items and
  // has no prior, bounds every score from |A| entries of G and rescores the candidates exactly;
  // with M PriorRidge's kernel rows are lookups. Results are the same bits with them or without;
  // only the work changes. set_gram(false) keeps this handle off both.
  void set_gram(bool on) noexcept { gram_ = on; }
  bool gram() const noexcept { return gram_; }
  // builds G (inv == nullptr) or M for inv (d values) if the matrix qualifies; true when ready
  bool prepare_gram(const double* inv = nullptr) const;
  bool gram_ready() const noexcept;           // G built (by any handle)
  int64_t gram_top_k_calls() const noexcept;  // one query's round top-k answered through G
  // bytes of the stored matrix (what one pass of top_k reads without the prefilter)
  int64_t nbytes() const noexcept;
  // true when the matrix is the caller's memory or a file map (view_* / open_npy)
  bool is_view() const noexcept;

  // Dequantized rows V[items] as double, out is m x d row-major.
  void rows(const int64_t* items, int64_t m, double* out) const;
  // The same rows as float32 (every storage's dequantized values are float32 numbers: the
  // same values, half the bytes).
  void rows(const int64_t* items, int64_t m, float* out) const;

  // Q queries U (Q x d float32, row-major). Writes Q x k scores and indices, each row sorted by
  // score descending, ties to the lower index. Throws invalid_argument when k exceeds the number
  // of available items of some query. A query whose mask allows few items (at most N / 8) reads
  // only their rows (the same scores, bit for bit, as the full pass).
  void top_k(const float* U, int64_t Q, int64_t k, const ExcludeLists& ex, float* out_scores,
             int64_t* out_idx) const;

  // Gumbel-top-k: key_i = (V u)_i / T + G(seed, q, i), G a standard Gumbel drawn from a
  // counter-based hash of (seed, query row q, item i); the top-k keys are k draws without
  // replacement from softmax(V u / T) over unmasked items. Writes keys and indices.
  void sample_softmax(const float* U, int64_t Q, int64_t k, const ExcludeLists& ex,
                      double temperature, uint64_t seed, float* out_keys, int64_t* out_idx) const;

  // k distinct items uniformly from the unmasked ones, for each of Q queries (row q uses the
  // stream (seed, q)). Writes Q x k ids.
  void sample_random(int64_t Q, int64_t k, const ExcludeLists& ex, uint64_t seed,
                     int64_t* out_idx) const;

 private:
  explicit Features(std::shared_ptr<const detail::FeatureData> data, int threads);
  void select_(const float* U, int64_t Q, int64_t k, const ExcludeLists& ex, bool gumbel,
               double temperature, uint64_t seed, float* out_s, int64_t* out_i) const;
  friend const detail::FeatureData& detail::data(const Features& f) noexcept;

  std::shared_ptr<const detail::FeatureData> data_;
  int threads_ = 1;
  bool prefilter_ = default_prefilter();
  bool gram_ = true;
  static bool default_prefilter() noexcept;
};

}  // namespace crossknn
