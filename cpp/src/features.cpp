// Item features: storage, dequantized rows, streaming top-k, Gumbel-top-k and random sampling.
#include "crossknn/features.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_set>

#include "crossknn/npy.h"
#include "features_impl.h"
#include "gram.h"
#include "kernels.h"

namespace crossknn {

using detail::parallel_for;

Storage parse_storage(const std::string& name) {
  if (name == "float32") return Storage::Float32;
  if (name == "float16") return Storage::Float16;
  if (name == "int8") return Storage::Int8;
  throw std::invalid_argument("storage must be 'float32', 'float16' or 'int8'; got '" + name + "'");
}

const char* storage_name(Storage s) noexcept {
  switch (s) {
    case Storage::Float32:
      return "float32";
    case Storage::Float16:
      return "float16";
    default:
      return "int8";
  }
}

int64_t mask_count(const uint64_t* words, int64_t n) noexcept {
  if (!words) return n;
  const int64_t full = n >> 6;
  int64_t c = 0;
  for (int64_t w = 0; w < full; ++w) c += __builtin_popcountll(words[w]);
  if (n & 63) c += __builtin_popcountll(words[full] & ((uint64_t{1} << (n & 63)) - 1));
  return c;
}

static int resolve_threads(int threads) {
  if (threads < 0 || threads > 1024)
    throw std::invalid_argument("threads must be in [0, 1024] (0 = all cores); got " +
                                std::to_string(threads));
  if (threads == 0) {
    const unsigned hc = std::thread::hardware_concurrency();
    return hc == 0 ? 1 : static_cast<int>(hc);
  }
  return threads;
}

namespace {

void check_shape(int64_t n, int64_t d) {
  if (n <= 0 || d <= 0)
    throw std::invalid_argument("V must be non-empty (N x d with N, d > 0); got " +
                                std::to_string(n) + " x " + std::to_string(d));
  if (n > std::numeric_limits<int64_t>::max() / d) throw std::length_error("N x d overflows");
}

[[noreturn]] void not_finite(int64_t i, int64_t d) {
  throw std::invalid_argument("V contains NaN or inf (row " + std::to_string(i / d) + ", column " +
                              std::to_string(i % d) + ")");
}

void check_scales(const float* scales, int64_t n) {
  for (int64_t r = 0; r < n; ++r)
    if (!(scales[r] > 0.f) || !std::isfinite(scales[r]))
      throw std::invalid_argument("int8 row scales must be finite and > 0; row " +
                                  std::to_string(r) + " has " + std::to_string(scales[r]));
}

}  // namespace

namespace detail {
const FeatureData& data(const Features& f) noexcept { return *f.data_; }
}  // namespace detail

Features::Features(std::shared_ptr<const detail::FeatureData> data, int threads)
    : data_(std::move(data)), threads_(resolve_threads(threads)) {}

Features::Features(const float* V, int64_t n, int64_t d, Storage storage, int threads)
    : threads_(resolve_threads(threads)) {
  check_shape(n, d);
  if (!V) throw std::invalid_argument("V is a null pointer");
  const int64_t total = n * d;
  for (int64_t i = 0; i < total; ++i)
    if (!std::isfinite(V[i])) not_finite(i, d);
  auto fd = std::make_shared<detail::FeatureData>();
  fd->n = n;
  fd->d = d;
  fd->st = storage;
  switch (storage) {
    case Storage::Float32:
      fd->own32.assign(V, V + total);
      fd->p32 = fd->own32.data();
      break;
    case Storage::Float16:
      fd->own16.resize(total);
      for (int64_t i = 0; i < total; ++i) fd->own16[i] = detail::float_to_half(V[i]);
      fd->p16 = fd->own16.data();
      break;
    case Storage::Int8:
      fd->own8.resize(total);
      fd->own_scale.resize(n);
      for (int64_t r = 0; r < n; ++r) {
        const float* v = V + r * d;
        float mx = 0.f;
        for (int64_t j = 0; j < d; ++j) mx = std::max(mx, std::fabs(v[j]));
        const float sc = mx > 0.f ? mx / 127.0f : 1.0f;
        fd->own_scale[r] = sc;
        for (int64_t j = 0; j < d; ++j) {
          float q = std::nearbyint(v[j] / sc);
          q = std::min(127.f, std::max(-127.f, q));
          fd->own8[r * d + j] = static_cast<int8_t>(q);
        }
      }
      fd->p8 = fd->own8.data();
      fd->pscale = fd->own_scale.data();
      break;
  }
  data_ = std::move(fd);
}

Features Features::view_float32(const float* V, int64_t n, int64_t d, int threads,
                                std::shared_ptr<const void> owner, bool check_finite) {
  check_shape(n, d);
  if (!V) throw std::invalid_argument("V is a null pointer");
  if (check_finite)
    for (int64_t i = 0; i < n * d; ++i)
      if (!std::isfinite(V[i])) not_finite(i, d);
  auto fd = std::make_shared<detail::FeatureData>();
  fd->n = n;
  fd->d = d;
  fd->st = Storage::Float32;
  fd->p32 = V;
  fd->owner = std::move(owner);
  fd->view = true;
  return Features(std::move(fd), threads);
}

Features Features::view_float16(const uint16_t* V, int64_t n, int64_t d, int threads,
                                std::shared_ptr<const void> owner, bool check_finite) {
  check_shape(n, d);
  if (!V) throw std::invalid_argument("V is a null pointer");
  if (check_finite)
    for (int64_t i = 0; i < n * d; ++i)
      if ((V[i] & 0x7c00u) == 0x7c00u) not_finite(i, d);  // exponent all ones: inf or NaN
  auto fd = std::make_shared<detail::FeatureData>();
  fd->n = n;
  fd->d = d;
  fd->st = Storage::Float16;
  fd->p16 = V;
  fd->owner = std::move(owner);
  fd->view = true;
  return Features(std::move(fd), threads);
}

Features Features::view_int8(const int8_t* V, const float* scales, int64_t n, int64_t d,
                             int threads, std::shared_ptr<const void> owner, bool check_finite) {
  check_shape(n, d);
  if (!V || !scales) throw std::invalid_argument("V or scales is a null pointer");
  if (check_finite) check_scales(scales, n);
  auto fd = std::make_shared<detail::FeatureData>();
  fd->n = n;
  fd->d = d;
  fd->st = Storage::Int8;
  fd->p8 = V;
  fd->pscale = scales;
  fd->owner = std::move(owner);
  fd->view = true;
  return Features(std::move(fd), threads);
}

Features Features::open_npy(const std::string& path, int threads, const std::string& scales_path,
                            bool check_finite) {
  NpyMap m = map_npy(path);
  const auto& h = m.header;
  if (h.shape.size() != 2)
    throw std::invalid_argument(path + ": an item matrix must be 2-D (N x d); got " +
                                std::to_string(h.shape.size()) + "-D");
  const int64_t n = h.shape[0], d = h.shape[1];
  auto owner = std::static_pointer_cast<const void>(m.file);
  switch (h.dtype) {
    case NpyDtype::Float32:
      return view_float32(static_cast<const float*>(m.data()), n, d, threads, owner, check_finite);
    case NpyDtype::Float16:
      return view_float16(static_cast<const uint16_t*>(m.data()), n, d, threads, owner,
                          check_finite);
    case NpyDtype::Int8: {
      if (scales_path.empty())
        throw std::invalid_argument(path +
                                    ": an int8 item matrix needs its row scales "
                                    "(scales_path, a float32 .npy of N values)");
      NpyMap s = map_npy(scales_path);
      if (s.header.dtype != NpyDtype::Float32 || s.header.count() != n ||
          s.header.shape.size() != 1)
        throw std::invalid_argument(scales_path + ": scales must be float32 of shape (" +
                                    std::to_string(n) + ",); got " +
                                    npy_dtype_name(s.header.dtype) + " with " +
                                    std::to_string(s.header.count()) + " values");
      struct Both {
        std::shared_ptr<const MappedFile> a, b;
      };
      auto both = std::make_shared<const Both>(Both{m.file, s.file});
      return view_int8(static_cast<const int8_t*>(m.data()), static_cast<const float*>(s.data()), n,
                       d, threads, both, check_finite);
    }
    default:
      throw std::invalid_argument(path +
                                  ": item matrix dtype must be float32, float16 or int8; "
                                  "got " +
                                  npy_dtype_name(h.dtype));
  }
}

int64_t Features::n_items() const noexcept { return data_->n; }
int64_t Features::dim() const noexcept { return data_->d; }
Storage Features::storage() const noexcept { return data_->st; }
bool Features::is_view() const noexcept { return data_->view; }

void Features::set_threads(int threads) { threads_ = resolve_threads(threads); }

int64_t Features::nbytes() const noexcept {
  const int64_t n_ = data_->n, d_ = data_->d;
  switch (data_->st) {
    case Storage::Float32:
      return n_ * d_ * 4;
    case Storage::Float16:
      return n_ * d_ * 2;
    default:
      return n_ * d_ + n_ * 4;
  }
}

static void check_item(int64_t i, int64_t n) {
  if (i < 0 || i >= n)
    throw std::out_of_range("item id " + std::to_string(i) + " is outside [0, " +
                            std::to_string(n) + ")");
}

namespace {

// V[items] dequantized into T (double or float: every storage's values are float32 numbers)
template <class T>
void gather_rows(const detail::FeatureData& fd, const int64_t* items, int64_t m, T* out) {
  const int64_t n_ = fd.n, d_ = fd.d;
  for (int64_t t = 0; t < m; ++t) check_item(items[t], n_);
  for (int64_t t = 0; t < m; ++t) {
    const int64_t r = items[t];
    T* o = out + t * d_;
    switch (fd.st) {
      case Storage::Float32:
        for (int64_t j = 0; j < d_; ++j) o[j] = static_cast<T>(fd.p32[r * d_ + j]);
        break;
      case Storage::Float16:
        for (int64_t j = 0; j < d_; ++j)
          o[j] = static_cast<T>(detail::half_to_float(fd.p16[r * d_ + j]));
        break;
      default:
        // the kernel computes scale * sum(q_j u_j): the dequantized row is q_j * scale (float)
        for (int64_t j = 0; j < d_; ++j)
          o[j] = static_cast<T>(static_cast<float>(fd.p8[r * d_ + j]) * fd.pscale[r]);
    }
  }
}

}  // namespace

void Features::rows(const int64_t* items, int64_t m, double* out) const {
  gather_rows(*data_, items, m, out);
}

void Features::rows(const int64_t* items, int64_t m, float* out) const {
  gather_rows(*data_, items, m, out);
}

namespace {

struct Entry {
  float s;
  int64_t i;
};
// a ranks before b: higher score, ties to the lower index
inline bool better(const Entry& a, const Entry& b) {
  return a.s > b.s || (a.s == b.s && a.i < b.i);
}

// A bounded heap of the k best entries; top() is the worst kept.
struct TopK {
  int64_t k = 0;
  std::vector<Entry> h;
  inline void push(float s, int64_t i) {
    if (static_cast<int64_t>(h.size()) < k) {
      h.push_back({s, i});
      std::push_heap(h.begin(), h.end(), better);
    } else if (better({s, i}, h.front())) {
      std::pop_heap(h.begin(), h.end(), better);
      h.back() = {s, i};
      std::push_heap(h.begin(), h.end(), better);
    }
  }
};

// What one query may choose: its allow mask (null: every item) and the sorted, de-duplicated
// ids it excludes among the allowed items (-1 padding dropped, range checked); `avail` counts
// the allowed items it does not exclude.
struct Eligible {
  std::vector<int64_t> ex;
  const uint64_t* allow = nullptr;
  int64_t allowed = 0, avail = 0;
};

std::vector<Eligible> prepare_exclude(const ExcludeLists& ex, int64_t Q, int64_t n, int64_t k) {
  if (k < 0) throw std::invalid_argument("k must be >= 0; got " + std::to_string(k));
  std::vector<Eligible> out(Q);
  for (int64_t q = 0; q < Q; ++q) {
    Eligible& el = out[q];
    el.allow = ex.allow_of(q);
    el.allowed = el.allow ? mask_count(el.allow, n) : n;
    auto& e = el.ex;
    if (ex.offsets) {
      const int64_t b = ex.offsets[q], t = ex.offsets[q + 1];
      if (b < 0 || t < b) throw std::invalid_argument("exclude offsets are not non-decreasing");
      for (int64_t j = b; j < t; ++j) {
        const int64_t i = ex.ids[j];
        if (i == -1) continue;
        check_item(i, n);
        if (mask_allows(el.allow, i)) e.push_back(i);
      }
      std::sort(e.begin(), e.end());
      e.erase(std::unique(e.begin(), e.end()), e.end());
    }
    el.avail = el.allowed - static_cast<int64_t>(e.size());
    if (k > el.avail)
      throw std::invalid_argument("k=" + std::to_string(k) + " exceeds the " +
                                  std::to_string(el.avail) + " items " +
                                  (el.allow ? "allowed and not excluded" : "not excluded") +
                                  (Q > 1 ? " for query " + std::to_string(q) : std::string()));
  }
  return out;
}

// The ids a query may choose, ascending (a query whose mask allows few items).
std::vector<int64_t> eligible_ids(const Eligible& el, int64_t n) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(el.avail));
  auto it = el.ex.begin();
  const int64_t words = mask_words(n);
  for (int64_t w = 0; w < words; ++w) {
    uint64_t bits = el.allow[w];
    if (w == words - 1 && (n & 63)) bits &= (uint64_t{1} << (n & 63)) - 1;
    while (bits) {
      const int64_t i = w * 64 + __builtin_ctzll(bits);
      bits &= bits - 1;
      while (it != el.ex.end() && *it < i) ++it;
      if (it != el.ex.end() && *it == i) continue;
      out.push_back(i);
    }
  }
  return out;
}

}  // namespace

bool Features::prefilter_ready() const noexcept { return data_->shadow_ready.load(); }

bool Features::prepare_gram(const double* inv) const {
  if (!gram_) return false;
  if (inv) return detail::build_weighted_gram(*data_, inv, threads_) != nullptr;
  return detail::build_gram(*data_, threads_) != nullptr;
}

bool Features::gram_ready() const noexcept { return detail::ready_gram(*data_) != nullptr; }

int64_t Features::gram_top_k_calls() const noexcept { return data_->gram_topk.load(); }

bool Features::default_prefilter() noexcept {
  static const bool on = [] {
    const char* e = std::getenv("CROSSKNN_NO_PREFILTER");
    return !(e && *e && std::strcmp(e, "0") != 0);
  }();
  return on;
}

namespace {

// Float32 rounding of one score: block_scores and shadow_scores sum d products along paths of
// at most d + 64 rounded operations (AVX2: d / 32 or d / 16 FMAs per lane, <= 6 reduction adds,
// <= 15 tail mul-adds; AVX-512 float16 copy: d / 32 + 2 FMAs per lane, 5 reduction adds;
// generic: d / 16 mul-adds per lane, 16 lane adds, 15 tail mul-adds), so
// |s_float - v.u| <= gamma * sum_j |v_j u_j| <= gamma ||v|| ||u||, gamma = n 2^-24 / (1 - n 2^-24),
// plus n subnormal rounding steps of at most 2^-149 each.
double rounding_gamma(int64_t d) {
  const double n = static_cast<double>(d + 64), u = std::ldexp(1.0, -24);
  return n * u / (1.0 - n * u) * 1.01 + std::ldexp(1.0, -40);
}

const detail::Shadow& shadow_of(const detail::FeatureData& fd, int threads) {
  std::call_once(fd.shadow_once, [&] {
    const int64_t n = fd.n, d = fd.d;
    auto sh = std::make_unique<detail::Shadow>();
    sh->h.resize(static_cast<size_t>(n * d));
    sh->err_norm.resize(static_cast<size_t>(n));
    const double gamma = rounding_gamma(d);
    const float* V = fd.p32;
    // column scales: powers of two (exact) that bring every column into [-1, 1], so that no
    // entry overflows float16 and the query's scaled entries stay in float32's normal range
    std::vector<double> cmax(static_cast<size_t>(d), 0.0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < d; ++j)
        cmax[j] = std::max(cmax[j], std::fabs(static_cast<double>(V[r * d + j])));
    sh->col_scale.resize(static_cast<size_t>(d));
    for (int64_t j = 0; j < d; ++j) {
      int e = 0;
      std::frexp(cmax[j], &e);  // cmax = m 2^e with m in [0.5, 1)
      sh->col_scale[j] = cmax[j] > 0.0 ? std::ldexp(1.0, e) : 1.0;
    }
    const int64_t bs = 256, n_blocks = (n + bs - 1) / bs;
    const int T = n * d < (1 << 22) ? 1 : threads;
    parallel_for(T, n_blocks, [&](int, int64_t b) {
      for (int64_t r = b * bs; r < std::min(n, (b + 1) * bs); ++r) {
        double r2 = 0.0, h2 = 0.0, x2 = 0.0;
        uint16_t* h = sh->h.data() + r * d;
        for (int64_t j = 0; j < d; ++j) {
          const double x = static_cast<double>(V[r * d + j]) / sh->col_scale[j];  // exact
          h[j] = detail::float_to_half(static_cast<float>(x));
          const double xh = detail::half_to_float(h[j]), res = x - xh;  // res: exact
          r2 += res * res;
          h2 += xh * xh;
          x2 += x * x;
        }
        // |v.u - float16 score| <= (||x - x_h|| + gamma (||x_h|| + ||x||)) ||u c||: the float16
        // rounding, then the float32 rounding of both kernels (x_h . u c here, v . u exactly)
        sh->err_norm[r] = (std::sqrt(r2) + gamma * (std::sqrt(h2) + std::sqrt(x2))) * (1.0 + 1e-9);
      }
    });
    double mxn = 0.0;
    for (int64_t r = 0; r < n; ++r) {
      double x2 = 0.0;
      for (int64_t j = 0; j < d; ++j) {
        const double x = static_cast<double>(V[r * d + j]) / sh->col_scale[j];
        x2 += x * x;
      }
      mxn = std::max(mxn, std::sqrt(x2) * 1.01);
    }
    sh->max_norm = mxn;
    fd.shadow = std::move(sh);
    fd.shadow_ready.store(true);
  });
  return *fd.shadow;
}

// power-of-two column scales bringing every column of V into [-1, 1]
std::vector<double> column_scales(const detail::FeatureData& fd) {
  const int64_t n = fd.n, d = fd.d;
  std::vector<double> cmax(static_cast<size_t>(d), 0.0), out(static_cast<size_t>(d));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < d; ++j)
      cmax[j] = std::max(cmax[j], std::fabs(static_cast<double>(fd.p32[r * d + j])));
  for (int64_t j = 0; j < d; ++j) {
    int e = 0;
    std::frexp(cmax[j], &e);  // cmax = m 2^e with m in [0.5, 1)
    out[j] = cmax[j] > 0.0 ? std::ldexp(1.0, e) : 1.0;
  }
  return out;
}

const detail::Shadow8& shadow8_of(const detail::FeatureData& fd, int threads) {
  std::call_once(fd.shadow8_once, [&] {
    const int64_t n = fd.n, d = fd.d;
    auto sh = std::make_unique<detail::Shadow8>();
    sh->q.resize(static_cast<size_t>(n * d));
    sh->scale.resize(static_cast<size_t>(n));
    sh->dq_norm.resize(static_cast<size_t>(n));
    sh->err_norm.resize(static_cast<size_t>(n));
    sh->gx_norm.resize(static_cast<size_t>(n));
    sh->col_scale = column_scales(fd);
    // columns with the same nonzero value in every row: exact, outside the int8 part
    sh->const_x.assign(static_cast<size_t>(d), 0.0);
    for (int64_t j = 0; j < d; ++j) {
      const float c = fd.p32[j];
      bool same = c != 0.f;
      for (int64_t r = 1; same && r < n; ++r) same = fd.p32[r * d + j] == c;
      if (same) {
        sh->const_cols.push_back(j);
        sh->const_x[j] = static_cast<double>(c) / sh->col_scale[j];  // exact
      }
    }
    const double gamma = rounding_gamma(d);
    std::vector<double> xn(static_cast<size_t>(n));
    const int64_t bs = 256, n_blocks = (n + bs - 1) / bs;
    const int T = n * d < (1 << 22) ? 1 : threads;
    parallel_for(T, n_blocks, [&](int, int64_t b) {
      std::vector<double> x(static_cast<size_t>(d));
      for (int64_t r = b * bs; r < std::min(n, (b + 1) * bs); ++r) {
        double mx = 0.0, x2 = 0.0;
        for (int64_t j = 0; j < d; ++j) {
          const double xj = static_cast<double>(fd.p32[r * d + j]) / sh->col_scale[j];  // exact
          x2 += xj * xj;
          x[j] = sh->const_x[j] != 0.0 ? 0.0 : xj;  // the quantized part
          mx = std::max(mx, std::fabs(x[j]));
        }
        const double sc = mx > 0.0 ? mx / 127.0 : 1.0;
        double dq2 = 0.0, r2 = 0.0, p2 = 0.0;
        int8_t* q = sh->q.data() + r * d;
        for (int64_t j = 0; j < d; ++j) {
          const double qv = std::min(127.0, std::max(-127.0, std::nearbyint(x[j] / sc)));
          q[j] = static_cast<int8_t>(qv);
          const double dq = qv * sc, res = x[j] - dq;
          dq2 += dq * dq;
          r2 += res * res;
          p2 += x[j] * x[j];
        }
        // the computed residuals are off by at most ~2^-51 (|x_j| + |dq_j|): the 2^-48 term
        sh->scale[r] = sc;
        sh->dq_norm[r] = std::sqrt(dq2) * (1.0 + 1e-9);
        sh->err_norm[r] =
            (std::sqrt(r2) + std::ldexp(std::sqrt(p2) + std::sqrt(dq2), -48)) * (1.0 + 1e-9);
        sh->gx_norm[r] = gamma * std::sqrt(x2) * (1.0 + 1e-9);
        xn[r] = std::sqrt(x2);
      }
    });
    double mxn = 0.0;
    for (int64_t r = 0; r < n; ++r) mxn = std::max(mxn, xn[r] * 1.01);
    sh->max_norm = mxn;
    fd.shadow8 = std::move(sh);
    fd.shadow_ready.store(true);
  });
  return *fd.shadow8;
}

// Rows that can enter a query's top k, from approximate scores s_r with proven error bounds
// e_r (|exact float32 score - s_r| <= e_r): per worker and query the k largest lower bounds and
// the rows whose upper bound reached the running k-th lower bound (it only rises, so no row is
// missed); then the rows whose upper bound reaches the k-th largest lower bound of all. `block`
// (worker, r0, r1, s, e) writes s and e for rows [r0, r1) of every query (Q x bs, row-major).
template <class Block>
bool candidates(int64_t n, int64_t Q, int64_t k, int64_t bs, int T,
                const std::vector<Eligible>& excl, const Block& block,
                std::vector<std::vector<int64_t>>& out) {
  const int64_t n_blocks = (n + bs - 1) / bs;
  struct Lists {
    std::vector<double> lo;                        // min-heap of the k largest lower bounds
    std::vector<std::pair<int64_t, double>> cand;  // (row, upper bound)
  };
  std::vector<std::vector<Lists>> lists(T, std::vector<Lists>(Q));
  std::vector<std::vector<double>> sbuf(T), ebuf(T);
  std::vector<std::vector<int32_t>> ibuf(T);
  constexpr int64_t kChunk = 64;
  const auto gt = std::greater<double>();
  parallel_for(T, n_blocks, [&](int w, int64_t b) {
    const int64_t r0 = b * bs, r1 = std::min(n, r0 + bs), nb = r1 - r0;
    auto &sv = sbuf[w], &ev = ebuf[w];
    sv.resize(static_cast<size_t>(bs * Q));
    ev.resize(static_cast<size_t>(bs * Q));
    block(w, r0, r1, sv.data(), ev.data());
    auto& pass = ibuf[w];
    pass.resize(static_cast<size_t>(kChunk));
    for (int64_t q = 0; q < Q; ++q) {
      const auto& e = excl[q].ex;
      const uint64_t* allow = excl[q].allow;
      auto it = std::lower_bound(e.begin(), e.end(), r0);
      Lists& L = lists[w][q];
      double thr = static_cast<int64_t>(L.lo.size()) < k ? -HUGE_VAL : L.lo.front();
      const double* sq = sv.data() + q * bs;
      const double* eq = ev.data() + q * bs;
      // chunks of rows: the ones whose upper bound reaches the threshold so far (it only rises,
      // so the rows left out would be skipped below too), then those one by one
      for (int64_t c0 = 0; c0 < nb; c0 += kChunk) {
        const int64_t m =
            detail::rows_reaching(sq + c0, eq + c0, std::min(kChunk, nb - c0), thr, pass.data());
        for (int64_t t = 0; t < m; ++t) {
          const int64_t x = c0 + pass[t], r = r0 + x;
          if (!mask_allows(allow, r)) continue;  // outside the query's mask
          while (it != e.end() && *it < r) ++it;
          if (it != e.end() && *it == r) continue;  // excluded
          const double sc = sq[x], err = eq[x];
          const double lo = sc - err, hi = sc + err;
          if (hi < thr) continue;
          L.cand.emplace_back(r, hi);
          if (static_cast<int64_t>(L.lo.size()) < k) {
            L.lo.push_back(lo);
            std::push_heap(L.lo.begin(), L.lo.end(), gt);
            if (static_cast<int64_t>(L.lo.size()) == k) thr = L.lo.front();
          } else if (lo > L.lo.front()) {
            std::pop_heap(L.lo.begin(), L.lo.end(), gt);
            L.lo.back() = lo;
            std::push_heap(L.lo.begin(), L.lo.end(), gt);
            thr = L.lo.front();
          }
        }
      }
    }
  });
  out.assign(static_cast<size_t>(Q), {});
  std::vector<double> los;
  for (int64_t q = 0; q < Q; ++q) {
    los.clear();
    for (int w = 0; w < T; ++w) los.insert(los.end(), lists[w][q].lo.begin(), lists[w][q].lo.end());
    if (static_cast<int64_t>(los.size()) < k) return false;  // cannot happen: k <= unmasked rows
    std::nth_element(los.begin(), los.begin() + (k - 1), los.end(), gt);
    const double bound = los[k - 1];
    for (int w = 0; w < T; ++w)
      for (const auto& c : lists[w][q].cand)
        if (c.second >= bound) out[q].push_back(c.first);
    std::sort(out[q].begin(), out[q].end());
  }
  return true;
}

int threads_for(double work, int threads, int64_t n_blocks) {
  return work < 4e6 ? 1 : static_cast<int>(std::min<int64_t>(threads, n_blocks));
}

// Candidates through the int8 copy (false: declined).
bool int8_candidates(const detail::FeatureData& fd, int threads, const float* U, int64_t Q,
                     int64_t k, const std::vector<Eligible>& excl,
                     std::vector<std::vector<int64_t>>& out) {
  const int64_t n = fd.n, d = fd.d;
  const detail::Shadow8& sh = shadow8_of(fd, threads);
  // u times the column scales (exact in double), rounded to int16 with scale su (the constant
  // columns: 0, their part sc_q is added exactly)
  std::vector<int16_t> uq(static_cast<size_t>(Q * d));
  std::vector<double> su(static_cast<size_t>(Q)), un(static_cast<size_t>(Q)),
      unq(static_cast<size_t>(Q)), wn(static_cast<size_t>(Q)), cs(static_cast<size_t>(Q)),
      ce(static_cast<size_t>(Q)), uc(static_cast<size_t>(d));
  for (int64_t q = 0; q < Q; ++q) {
    double mx = 0.0, u2 = 0.0, q2 = 0.0, c = 0.0, cabs = 0.0;
    for (int64_t j = 0; j < d; ++j) {
      uc[j] = static_cast<double>(U[q * d + j]) * sh.col_scale[j];
      u2 += uc[j] * uc[j];
      if (sh.const_x[j] != 0.0) {
        const double p = sh.const_x[j] * uc[j];  // a float times a float: exact
        c += p;
        cabs += std::fabs(p);
        uc[j] = 0.0;
      }
      mx = std::max(mx, std::fabs(uc[j]));
      q2 += uc[j] * uc[j];
    }
    if (!std::isfinite(u2)) return false;
    const double sq = mx > 0.0 ? mx / 32767.0 : 1.0;
    double w2 = 0.0;
    for (int64_t j = 0; j < d; ++j) {
      const double x = std::min(32767.0, std::max(-32767.0, std::nearbyint(uc[j] / sq)));
      uq[q * d + j] = static_cast<int16_t>(x);
      const double w = uc[j] - x * sq;
      w2 += w * w;
    }
    su[q] = sq;
    un[q] = std::sqrt(u2) * (1.0 + 1e-9);
    unq[q] = std::sqrt(q2) * (1.0 + 1e-9);
    wn[q] = (std::sqrt(w2) + std::ldexp(un[q], -50)) * (1.0 + 1e-9);
    cs[q] = c;
    ce[q] = static_cast<double>(sh.const_cols.size()) * std::ldexp(cabs, -52);  // its rounding
    if (!(sh.max_norm * un[q] < 1e37)) return false;  // float32 sums could overflow
  }
  const double tiny = 2.0 * static_cast<double>(d + 64) * std::ldexp(1.0, -148);
  const int64_t bs = std::max<int64_t>(64, std::min<int64_t>(4096, (256 << 10) / d));
  const int T = threads_for(static_cast<double>(n) * d * Q / 4.0, threads, (n + bs - 1) / bs);
  std::vector<std::vector<int64_t>> tot(static_cast<size_t>(T));
  // with N the other columns and C the constant ones (Cauchy-Schwarz on N):
  // |v.u - s| <= ||q sc|| ||w|| + ||x_N - q sc|| ||(u c)_N|| + gamma ||x|| ||u c|| (+ roundings)
  auto block = [&](int w, int64_t r0, int64_t r1, double* s, double* e) {
    auto& t = tot[w];
    t.resize(static_cast<size_t>(r1 - r0));
    for (int64_t q = 0; q < Q; ++q) {
      detail::int8_totals(sh.q.data(), d, r0, r1, uq.data() + q * d, t.data());
      const detail::Int8Bound bq{su[q], cs[q], wn[q], unq[q], un[q], ce[q], tiny};
      detail::int8_bounds(t.data(), r1 - r0, sh.scale.data() + r0, sh.dq_norm.data() + r0,
                          sh.err_norm.data() + r0, sh.gx_norm.data() + r0, bq, s + q * bs,
                          e + q * bs);
    }
  };
  return candidates(n, Q, k, bs, T, excl, block, out);
}

// The queries for the float16 copy: times the column scales (exact in float32, else decline),
// their norms (entries below float32's normal range are dropped: |x_h . w| <= max_norm ||w|| is
// added to the bound). false: declined.
struct F16Queries {
  std::vector<float> Uc;
  std::vector<double> un, dropped;
  double tiny = 0.0;  // subnormal rounding steps
};
bool float16_queries(const detail::Shadow& sh, const float* U, int64_t Q, int64_t d,
                     F16Queries& out) {
  out.tiny = 2.0 * static_cast<double>(d + 64) * std::ldexp(1.0, -148);
  out.Uc.resize(static_cast<size_t>(Q * d));
  out.un.resize(static_cast<size_t>(Q));
  out.dropped.resize(static_cast<size_t>(Q));
  for (int64_t q = 0; q < Q; ++q) {
    double u2 = 0.0, w2 = 0.0;
    for (int64_t j = 0; j < d; ++j) {
      const double x = static_cast<double>(U[q * d + j]) * sh.col_scale[j];
      float xf = static_cast<float>(x);
      if (std::fabs(x) < FLT_MIN) {
        xf = 0.f;
        w2 += x * x;
      } else if (static_cast<double>(xf) != x) {
        return false;  // overflow: the full pass decides
      }
      out.Uc[q * d + j] = xf;
      u2 += x * x;
    }
    out.un[q] = std::sqrt(u2) * (1.0 + 1e-9);
    out.dropped[q] = sh.max_norm * std::sqrt(w2) * 1.01;
    if (!(sh.max_norm * out.un[q] < 1e37)) return false;  // float32 sums could overflow
  }
  return true;
}

// the bound of a float16 score v of row r for query q (|exact - v| <= it)
inline double float16_error(const detail::Shadow& sh, const F16Queries& fq, int64_t r, int64_t q,
                            double v) {
  return sh.err_norm[r] * fq.un[q] + fq.dropped[q] + 2.3e-16 * std::fabs(v) + fq.tiny;
}

// Candidates through the float16 copy (false: declined).
bool float16_candidates(const detail::FeatureData& fd, int threads, const float* U, int64_t Q,
                        int64_t k, const std::vector<Eligible>& excl,
                        std::vector<std::vector<int64_t>>& out) {
  const int64_t n = fd.n, d = fd.d;
  const detail::Shadow& sh = shadow_of(fd, threads);
  F16Queries fq;
  if (!float16_queries(sh, U, Q, d, fq)) return false;
  const int64_t bs = std::max<int64_t>(64, std::min<int64_t>(4096, (256 << 10) / (2 * d)));
  const int T = threads_for(static_cast<double>(n) * d * Q / 2.0, threads, (n + bs - 1) / bs);
  std::vector<std::vector<float>> bufs(static_cast<size_t>(T));
  auto block = [&](int w, int64_t r0, int64_t r1, double* s, double* e) {
    auto& b = bufs[w];
    b.resize(static_cast<size_t>(r1 - r0));
    for (int64_t q = 0; q < Q; ++q) {
      detail::shadow_scores(sh.h.data(), d, r0, r1, fq.Uc.data() + q * d, b.data());
      for (int64_t r = r0; r < r1; ++r) {
        const double v = b[r - r0];
        s[q * bs + (r - r0)] = v;
        e[q * bs + (r - r0)] = float16_error(sh, fq, r, q, v);
      }
    }
  };
  return candidates(n, Q, k, bs, T, excl, block, out);
}

// Narrows each query's candidate rows (a set that holds its top k) with the float16 copy: the
// rows whose upper bound reaches the k-th largest lower bound among them. The k-th largest lower
// bound of a set holding the top k is at most the k-th best exact score, so no top-k row is
// dropped. false: declined (cand unchanged, still valid).
bool float16_narrow(const detail::FeatureData& fd, int threads, const float* U, int64_t Q,
                    int64_t k, std::vector<std::vector<int64_t>>& cand) {
  const int64_t d = fd.d;
  const detail::Shadow& sh = shadow_of(fd, threads);
  F16Queries fq;
  if (!float16_queries(sh, U, Q, d, fq)) return false;
  std::vector<float> v;
  std::vector<double> lo, hi, los;
  for (int64_t q = 0; q < Q; ++q) {
    auto& rows = cand[q];
    const int64_t m = static_cast<int64_t>(rows.size());
    if (m <= k) continue;
    v.resize(static_cast<size_t>(m));
    detail::shadow_rows(sh.h.data(), d, rows.data(), m, fq.Uc.data() + q * d, v.data());
    lo.resize(static_cast<size_t>(m));
    hi.resize(static_cast<size_t>(m));
    for (int64_t t = 0; t < m; ++t) {
      const double e = float16_error(sh, fq, rows[t], q, v[t]);
      lo[t] = v[t] - e;
      hi[t] = v[t] + e;
    }
    los = lo;
    std::nth_element(los.begin(), los.begin() + (k - 1), los.end(), std::greater<double>());
    const double bound = los[k - 1];
    int64_t kept = 0;
    for (int64_t t = 0; t < m; ++t)
      if (hi[t] >= bound) rows[kept++] = rows[t];
    rows.resize(static_cast<size_t>(kept));
    fd.narrowed.fetch_add(1, std::memory_order_relaxed);
  }
  return true;
}

// Exact scores of each query's candidate rows (a set holding its top k), the top k of those.
// false when a score is not finite (the full pass decides).
bool rescore_top_k(const detail::FeatureData& fd, const float* U, int64_t Q, int64_t k,
                   const std::vector<std::vector<int64_t>>& cand, float* out_s, int64_t* out_i) {
  const int64_t d = fd.d;
  std::vector<float> exact;
  std::vector<Entry> all;
  for (int64_t q = 0; q < Q; ++q) {
    const auto& rows = cand[q];
    exact.resize(rows.size());
    detail::gather_scores(fd, rows.data(), static_cast<int64_t>(rows.size()), U + q * d,
                          exact.data());
    all.clear();
    for (size_t t = 0; t < rows.size(); ++t) {
      if (!std::isfinite(exact[t])) return false;
      all.push_back({exact[t], rows[t]});
    }
    if (static_cast<int64_t>(all.size()) < k) return false;
    std::partial_sort(all.begin(), all.begin() + k, all.end(), better);
    for (int64_t t = 0; t < k; ++t) {
      out_s[q * k + t] = all[t].s;
      out_i[q * k + t] = all[t].i;
    }
  }
  return true;
}

// The top-k through the copies: the int8 one first (a quarter of float32's bytes); where its
// bound leaves more than max(3k, N / 16) candidates the float16 copy narrows them (those rows
// only: at most half of a full pass; a float16 row costs half the bytes of its exact rescoring,
// and ~k rows are left, so narrowing pays from ~2.4k rows); where it leaves more than N / 2
// (columns whose values it
// resolves too coarsely) a full pass through the float16 copy, and after three such calls the
// float16 one only. Exact scores for the
// candidates, the top k of those. false when it declines (scores that could overflow, a scaled
// query not exact in float32: the full pass decides).
bool prefilter_top_k(const detail::FeatureData& fd, int threads, const float* U, int64_t Q,
                     int64_t k, const std::vector<Eligible>& excl, float* out_s, int64_t* out_i) {
  const int64_t n = fd.n;
  std::vector<std::vector<int64_t>> cand;
  bool ok = false;
  if (fd.int8_misses.load(std::memory_order_relaxed) < 3) {
    ok = int8_candidates(fd, threads, U, Q, k, excl, cand);
    bool wide = false;
    if (ok)
      for (const auto& c : cand) {
        const int64_t m = static_cast<int64_t>(c.size());
        if (m > n / 2) {  // the int8 bound resolves this matrix too coarsely: full float16 pass
          fd.int8_misses.fetch_add(1, std::memory_order_relaxed);
          ok = false;
          break;
        }
        wide = wide || m > std::max<int64_t>(3 * k, n / 16);
      }
    // many candidates: the float16 copy narrows them (its rows only, not a full pass); where it
    // declines, the int8 candidates are rescored as they are (they hold the top k too)
    if (ok && wide) float16_narrow(fd, threads, U, Q, k, cand);
  }
  if (!ok && !float16_candidates(fd, threads, U, Q, k, excl, cand)) return false;
  return rescore_top_k(fd, U, Q, k, cand, out_s, out_i);
}

}  // namespace

namespace detail {

double float32_score_gamma(int64_t d) { return rounding_gamma(d); }

bool bounded_top_k(const FeatureData& fd, const float* u, int64_t k, const ExcludeLists& ex,
                   int64_t bs, const BoundsFn& bounds, int64_t max_candidates, float* out_s,
                   int64_t* out_i) {
  const auto excl = prepare_exclude(ex, 1, fd.n, k);
  if (k == 0) return true;
  std::vector<std::vector<int64_t>> cand;
  auto block = [&](int, int64_t r0, int64_t r1, double* s, double* e) { bounds(r0, r1, s, e); };
  if (!candidates(fd.n, 1, k, bs, 1, excl, block, cand)) return false;
  // many rows: the float16 copy narrows them first (as prefilter_top_k does the int8 ones)
  if (static_cast<int64_t>(cand[0].size()) > std::max<int64_t>(3 * k, fd.n / 16) &&
      fd.st == Storage::Float32)
    float16_narrow(fd, 1, u, 1, k, cand);
  if (static_cast<int64_t>(cand[0].size()) > max_candidates) return false;
  return rescore_top_k(fd, u, 1, k, cand, out_s, out_i);
}

}  // namespace detail

void Features::top_k(const float* U, int64_t Q, int64_t k, const ExcludeLists& ex,
                     float* out_scores, int64_t* out_idx) const {
  select_(U, Q, k, ex, false, 1.0, 0, out_scores, out_idx);
}

void Features::sample_softmax(const float* U, int64_t Q, int64_t k, const ExcludeLists& ex,
                              double temperature, uint64_t seed, float* out_keys,
                              int64_t* out_idx) const {
  if (!(temperature > 0.0) || !std::isfinite(temperature))
    throw std::invalid_argument("temperature must be a finite number > 0; got " +
                                std::to_string(temperature));
  select_(U, Q, k, ex, true, temperature, seed, out_keys, out_idx);
}

void Features::select_(const float* U, int64_t Q, int64_t k, const ExcludeLists& ex, bool gumbel,
                       double temperature, uint64_t seed, float* out_s, int64_t* out_i) const {
  const int64_t n_ = data_->n, d_ = data_->d;
  if (Q < 0) throw std::invalid_argument("number of queries must be >= 0");
  for (int64_t i = 0; i < Q * d_; ++i)
    if (!std::isfinite(U[i]))
      throw std::invalid_argument("u contains NaN or inf (query " + std::to_string(i / d_) + ")");
  const auto excl = prepare_exclude(ex, Q, n_, k);
  if (Q == 0 || k == 0) return;
  const detail::FeatureData& fd = *data_;
  std::vector<uint64_t> keys(Q);
  for (int64_t q = 0; q < Q; ++q) keys[q] = detail::stream_key(seed, static_cast<uint64_t>(q));
  const double inv_t = 1.0 / temperature;
  const float NEG_INF = -std::numeric_limits<float>::infinity();
  // queries whose masks allow at most N / 8 items read only those rows (gather_scores: the bits
  // of the full pass), when every query of the call does (float32 / float16 storage)
  const bool few = fd.st != Storage::Int8 &&
                   std::all_of(excl.begin(), excl.end(),
                               [&](const Eligible& e) { return e.allow && e.allowed * 8 <= n_; });
  if (few) {
    const double rows_read = std::accumulate(
        excl.begin(), excl.end(), 0.0, [](double a, const Eligible& e) { return a + e.avail; });
    const int T = rows_read * d_ < 4e6 ? 1 : static_cast<int>(std::min<int64_t>(threads_, Q));
    parallel_for(T, Q, [&](int, int64_t q) {
      const std::vector<int64_t> rows = eligible_ids(excl[q], n_);
      const int64_t m = static_cast<int64_t>(rows.size());
      std::vector<float> sc(static_cast<size_t>(m));
      detail::gather_scores(fd, rows.data(), m, U + q * d_, sc.data());
      std::vector<Entry> all(static_cast<size_t>(m));
      for (int64_t t = 0; t < m; ++t) {
        float v = sc[t];
        if (gumbel) {
          const double g = -std::log(-std::log(detail::uniform01(keys[q], rows[t])));
          v = static_cast<float>(static_cast<double>(v) * inv_t + g);
        }
        if (std::isnan(v)) v = NEG_INF;
        all[t] = {v, rows[t]};
      }
      std::partial_sort(all.begin(), all.begin() + k, all.end(), better);
      for (int64_t t = 0; t < k; ++t) {
        out_s[q * k + t] = all[t].s;
        out_i[q * k + t] = all[t].i;
      }
    });
    return;
  }
  if (!gumbel && prefilter_ && fd.st == Storage::Float32 && 4 * k <= n_ &&
      fd.topk_calls.fetch_add(1, std::memory_order_relaxed) >= 1 &&
      prefilter_top_k(fd, threads_, U, Q, k, excl, out_s, out_i))
    return;

  // block of rows per task: about 256 KiB of V, at least 64 rows
  const int64_t row_bytes = nbytes() / n_;
  const int64_t bs = std::max<int64_t>(64, std::min<int64_t>(4096, (256 << 10) / row_bytes));
  const int64_t n_blocks = (n_ + bs - 1) / bs;
  // small jobs (under ~1 ms of work) on one thread: starting threads costs more than it saves
  const double work = static_cast<double>(n_) * d_ * Q;
  const int T = work < 4e6 ? 1 : static_cast<int>(std::min<int64_t>(threads_, n_blocks));

  std::vector<std::vector<TopK>> heaps(T, std::vector<TopK>(Q));
  for (auto& hs : heaps)
    for (auto& h : hs) h.k = k;
  std::vector<std::vector<float>> bufs(T);
  const detail::Queries qs = detail::prepare_queries(*data_, U, Q);

  parallel_for(T, n_blocks, [&](int w, int64_t b) {
    const int64_t r0 = b * bs, r1 = std::min(n_, r0 + bs), nb = r1 - r0;
    auto& buf = bufs[w];
    if (buf.size() < static_cast<size_t>(bs * Q)) buf.resize(bs * Q);
    detail::block_scores(*data_, r0, r1, qs, buf.data(), bs);
    for (int64_t q = 0; q < Q; ++q) {
      const auto& e = excl[q].ex;
      const uint64_t* allow = excl[q].allow;
      auto it = std::lower_bound(e.begin(), e.end(), r0);
      int64_t next_ex = it == e.end() ? n_ : *it;
      const float* s = buf.data() + q * bs;
      TopK& h = heaps[w][q];
      for (int64_t t = 0; t < nb; ++t) {
        const int64_t i = r0 + t;
        if (i == next_ex) {
          ++it;
          next_ex = it == e.end() ? n_ : *it;
          continue;
        }
        if (!mask_allows(allow, i)) continue;
        float v = s[t];
        if (gumbel) {
          const double g = -std::log(-std::log(detail::uniform01(keys[q], i)));
          v = static_cast<float>(static_cast<double>(v) * inv_t + g);
        }
        if (std::isnan(v)) v = NEG_INF;
        h.push(v, i);
      }
    }
  });

  // merge: the k best of all per-thread heaps under the strict order `better`
  std::vector<Entry> all;
  for (int64_t q = 0; q < Q; ++q) {
    all.clear();
    for (int w = 0; w < T; ++w) all.insert(all.end(), heaps[w][q].h.begin(), heaps[w][q].h.end());
    std::partial_sort(all.begin(), all.begin() + k, all.end(), better);
    for (int64_t t = 0; t < k; ++t) {
      out_s[q * k + t] = all[t].s;
      out_i[q * k + t] = all[t].i;
    }
  }
}

void Features::sample_random(int64_t Q, int64_t k, const ExcludeLists& ex, uint64_t seed,
                             int64_t* out_idx) const {
  const int64_t n_ = data_->n;
  if (Q < 0) throw std::invalid_argument("number of queries must be >= 0");
  const auto excl = prepare_exclude(ex, Q, n_, k);
  for (int64_t q = 0; q < Q; ++q) {
    const auto& e = excl[q].ex;
    const uint64_t* allow = excl[q].allow;
    const int64_t avail = excl[q].avail;
    const uint64_t key = detail::stream_key(seed, static_cast<uint64_t>(q));
    int64_t* out = out_idx + q * k;
    // rejection draws from all N ids: when at least 1/8 of them are allowed (always, unmasked)
    if (2 * k <= avail && (!allow || 8 * excl[q].allowed >= n_)) {
      // sparse: rejection sampling from a counter-based stream
      std::unordered_set<int64_t> chosen;
      chosen.reserve(static_cast<size_t>(2 * k));
      int64_t got = 0;
      for (uint64_t c = 0; got < k; ++c) {
        const uint64_t h = detail::mix64(key ^ detail::mix64(c));
        const int64_t i = static_cast<int64_t>(
            (static_cast<unsigned __int128>(h) * static_cast<uint64_t>(n_)) >> 64);
        if (!mask_allows(allow, i)) continue;
        if (std::binary_search(e.begin(), e.end(), i)) continue;
        if (!chosen.insert(i).second) continue;
        out[got++] = i;
      }
    } else {
      // dense: the k available items with the smallest hash keys (a uniform random k-subset)
      std::vector<std::pair<uint64_t, int64_t>> cand;
      cand.reserve(static_cast<size_t>(avail));
      const auto hashed = [&](int64_t i) {
        cand.push_back({detail::mix64(key ^ detail::mix64(static_cast<uint64_t>(i))), i});
      };
      if (allow) {
        for (int64_t i : eligible_ids(excl[q], n_)) hashed(i);
      } else {
        auto it = e.begin();
        for (int64_t i = 0; i < n_; ++i) {
          if (it != e.end() && *it == i) {
            ++it;
            continue;
          }
          hashed(i);
        }
      }
      std::partial_sort(cand.begin(), cand.begin() + k, cand.end());
      for (int64_t t = 0; t < k; ++t) out[t] = cand[t].second;
    }
  }
}

}  // namespace crossknn
