// Item features: storage, dequantized rows, streaming top-k, Gumbel-top-k and random sampling.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_set>

#include "crossknn/engine.h"
#include "kernels.h"

namespace crossknn {

using detail::parallel_for;

Storage parse_storage(const std::string& name) {
  if (name == "float32") return Storage::Float32;
  if (name == "float16") return Storage::Float16;
  if (name == "int8") return Storage::Int8;
  throw std::invalid_argument("storage must be 'float32', 'float16' or 'int8'; got '" + name +
                              "'");
}

const char* storage_name(Storage s) noexcept {
  switch (s) {
    case Storage::Float32: return "float32";
    case Storage::Float16: return "float16";
    default: return "int8";
  }
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

Features::Features(const float* V, int64_t n, int64_t d, Storage storage, int threads)
    : n_(n), d_(d), storage_(storage), threads_(resolve_threads(threads)) {
  if (n <= 0 || d <= 0)
    throw std::invalid_argument("V must be non-empty (N x d with N, d > 0); got " +
                                std::to_string(n) + " x " + std::to_string(d));
  if (!V) throw std::invalid_argument("V is a null pointer");
  const int64_t total = n * d;
  if (total / d != n) throw std::length_error("N x d overflows");
  for (int64_t i = 0; i < total; ++i)
    if (!std::isfinite(V[i]))
      throw std::invalid_argument("V contains NaN or inf (row " + std::to_string(i / d) +
                                  ", column " + std::to_string(i % d) + ")");
  switch (storage) {
    case Storage::Float32:
      f32_.assign(V, V + total);
      break;
    case Storage::Float16:
      f16_.resize(total);
      for (int64_t i = 0; i < total; ++i) f16_[i] = detail::float_to_half(V[i]);
      break;
    case Storage::Int8:
      i8_.resize(total);
      scale_.resize(n);
      for (int64_t r = 0; r < n; ++r) {
        const float* v = V + r * d;
        float mx = 0.f;
        for (int64_t j = 0; j < d; ++j) mx = std::max(mx, std::fabs(v[j]));
        const float sc = mx > 0.f ? mx / 127.0f : 1.0f;
        scale_[r] = sc;
        for (int64_t j = 0; j < d; ++j) {
          float q = std::nearbyint(v[j] / sc);
          q = std::min(127.f, std::max(-127.f, q));
          i8_[r * d + j] = static_cast<int8_t>(q);
        }
      }
      break;
  }
}

void Features::set_threads(int threads) { threads_ = resolve_threads(threads); }

int64_t Features::nbytes() const noexcept {
  switch (storage_) {
    case Storage::Float32: return n_ * d_ * 4;
    case Storage::Float16: return n_ * d_ * 2;
    default: return n_ * d_ + n_ * 4;
  }
}

static void check_item(int64_t i, int64_t n) {
  if (i < 0 || i >= n)
    throw std::out_of_range("item id " + std::to_string(i) + " is outside [0, " +
                            std::to_string(n) + ")");
}

void Features::rows(const int64_t* items, int64_t m, double* out) const {
  for (int64_t t = 0; t < m; ++t) check_item(items[t], n_);
  for (int64_t t = 0; t < m; ++t) {
    const int64_t r = items[t];
    double* o = out + t * d_;
    switch (storage_) {
      case Storage::Float32:
        for (int64_t j = 0; j < d_; ++j) o[j] = f32_[r * d_ + j];
        break;
      case Storage::Float16:
        for (int64_t j = 0; j < d_; ++j) o[j] = detail::half_to_float(f16_[r * d_ + j]);
        break;
      default:
        // the kernel computes scale * sum(q_j u_j): the dequantized row is q_j * scale (float)
        for (int64_t j = 0; j < d_; ++j)
          o[j] = static_cast<double>(static_cast<float>(i8_[r * d_ + j]) * scale_[r]);
    }
  }
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

// Sorted, de-duplicated exclusion ids for each query; -1 padding dropped; range checked.
std::vector<std::vector<int64_t>> prepare_exclude(const ExcludeLists& ex, int64_t Q, int64_t n,
                                                  int64_t k) {
  if (k < 0) throw std::invalid_argument("k must be >= 0; got " + std::to_string(k));
  std::vector<std::vector<int64_t>> out(Q);
  for (int64_t q = 0; q < Q; ++q) {
    auto& e = out[q];
    if (ex.offsets) {
      const int64_t b = ex.offsets[q], t = ex.offsets[q + 1];
      if (b < 0 || t < b) throw std::invalid_argument("exclude offsets are not non-decreasing");
      for (int64_t j = b; j < t; ++j) {
        const int64_t i = ex.ids[j];
        if (i == -1) continue;
        check_item(i, n);
        e.push_back(i);
      }
      std::sort(e.begin(), e.end());
      e.erase(std::unique(e.begin(), e.end()), e.end());
    }
    const int64_t avail = n - static_cast<int64_t>(e.size());
    if (k > avail)
      throw std::invalid_argument("k=" + std::to_string(k) + " exceeds the " +
                                  std::to_string(avail) + " items not excluded" +
                                  (Q > 1 ? " for query " + std::to_string(q) : std::string()));
  }
  return out;
}

}  // namespace

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

void Features::select_(const float* U, int64_t Q, int64_t k, const ExcludeLists& ex,
                       bool gumbel, double temperature, uint64_t seed, float* out_s,
                       int64_t* out_i) const {
  if (Q < 0) throw std::invalid_argument("number of queries must be >= 0");
  for (int64_t i = 0; i < Q * d_; ++i)
    if (!std::isfinite(U[i]))
      throw std::invalid_argument("u contains NaN or inf (query " + std::to_string(i / d_) +
                                  ")");
  const auto excl = prepare_exclude(ex, Q, n_, k);
  if (Q == 0 || k == 0) return;

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
  std::vector<uint64_t> keys(Q);
  for (int64_t q = 0; q < Q; ++q) keys[q] = detail::stream_key(seed, static_cast<uint64_t>(q));
  const double inv_t = 1.0 / temperature;
  const detail::Queries qs = detail::prepare_queries(*this, U, Q);
  const float NEG_INF = -std::numeric_limits<float>::infinity();

  parallel_for(T, n_blocks, [&](int w, int64_t b) {
    const int64_t r0 = b * bs, r1 = std::min(n_, r0 + bs), nb = r1 - r0;
    auto& buf = bufs[w];
    if (buf.size() < static_cast<size_t>(bs * Q)) buf.resize(bs * Q);
    detail::block_scores(*this, r0, r1, qs, buf.data(), bs);
    for (int64_t q = 0; q < Q; ++q) {
      const auto& e = excl[q];
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
  if (Q < 0) throw std::invalid_argument("number of queries must be >= 0");
  const auto excl = prepare_exclude(ex, Q, n_, k);
  for (int64_t q = 0; q < Q; ++q) {
    const auto& e = excl[q];
    const int64_t avail = n_ - static_cast<int64_t>(e.size());
    const uint64_t key = detail::stream_key(seed, static_cast<uint64_t>(q));
    int64_t* out = out_idx + q * k;
    if (2 * k <= avail) {
      // sparse: rejection sampling from a counter-based stream
      std::unordered_set<int64_t> chosen;
      chosen.reserve(static_cast<size_t>(2 * k));
      int64_t got = 0;
      for (uint64_t c = 0; got < k; ++c) {
        const uint64_t h = detail::mix64(key ^ detail::mix64(c));
        const int64_t i =
            static_cast<int64_t>((static_cast<unsigned __int128>(h) * static_cast<uint64_t>(n_)) >> 64);
        if (std::binary_search(e.begin(), e.end(), i)) continue;
        if (!chosen.insert(i).second) continue;
        out[got++] = i;
      }
    } else {
      // dense: the k unmasked items with the smallest hash keys (a uniform random k-subset)
      std::vector<std::pair<uint64_t, int64_t>> cand;
      cand.reserve(static_cast<size_t>(avail));
      auto it = e.begin();
      for (int64_t i = 0; i < n_; ++i) {
        if (it != e.end() && *it == i) {
          ++it;
          continue;
        }
        cand.push_back({detail::mix64(key ^ detail::mix64(static_cast<uint64_t>(i))), i});
      }
      std::partial_sort(cand.begin(), cand.begin() + k, cand.end());
      for (int64_t t = 0; t < k; ++t) out[t] = cand[t].second;
    }
  }
}

}  // namespace crossknn
