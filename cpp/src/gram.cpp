// The item Gram cache of the least-squares rounds (see gram.h).
#include "gram.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

#include "clones.h"
#include "dots.h"
#include "kernels.h"

namespace crossknn::detail {

int64_t gram_limit_bytes() noexcept {
  static const int64_t limit = [] {
    const char* e = std::getenv("CROSSKNN_GRAM_MB");
    int64_t mb = 256;
    if (e && *e) {
      char* end = nullptr;
      const long long v = std::strtoll(e, &end, 10);
      if (end && *end == '\0' && v >= 0 && v < (int64_t{1} << 40)) mb = v;
    }
    return mb << 20;
  }();
  return limit;
}

namespace {

// The span pass over rows of G (memory-bound, when vectorized; clones.h). Only bounds come out
// of it (the exact scores are the rescoring kernel's), so its rounding needs no fixed order.

// s += sum_t c_t g_t (double rows; up to four at a time)
CROSSKNN_CLONES_AVX512 void span_rows(const double* const* g, const double* c, int nr, int64_t nb,
                                    double* s) {
  if (nr == 4) {
    const double c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3];
    const double *g0 = g[0], *g1 = g[1], *g2 = g[2], *g3 = g[3];
    for (int64_t x = 0; x < nb; ++x) s[x] += (c0 * g0[x] + c1 * g1[x]) + (c2 * g2[x] + c3 * g3[x]);
    return;
  }
  for (int t = 0; t < nr; ++t)
    for (int64_t x = 0; x < nb; ++x) s[x] += c[t] * g[t][x];
}

// below ~128 columns the solver's dots are cheap and the int8 pass is narrow: no cache
constexpr int64_t kMinDim = 128;

// an N x N matrix of doubles within the limit
bool qualifies(const FeatureData& fd) noexcept {
  if (fd.st != Storage::Float32 || fd.n < 1 || fd.d < kMinDim) return false;
  const double bytes = static_cast<double>(fd.n) * static_cast<double>(fd.n) * 8.0;
  return bytes <= static_cast<double>(gram_limit_bytes());
}

}  // namespace

const ItemGram* ready_gram(const FeatureData& fd) noexcept {
  return fd.gram_ready.load(std::memory_order_acquire) ? fd.gram.get() : nullptr;
}

const ItemGram* build_gram(const FeatureData& fd, int threads) {
  if (!qualifies(fd)) return nullptr;
  std::call_once(fd.gram_once, [&] {
    const int64_t n = fd.n, d = fd.d;
    std::unique_ptr<ItemGram> G;
    try {
      G = std::make_unique<ItemGram>();
      G->g.assign(static_cast<size_t>(n * n), 0.0);
      G->norm.resize(static_cast<size_t>(n));
    } catch (const std::bad_alloc&) {
      return;  // no memory for it: the rounds run as without the cache
    }
    const float* V = fd.p32;
    // lower triangle in blocks of 16 rows (the solver's kernel), the longest blocks first
    const int64_t bs = 16, n_blocks = (n + bs - 1) / bs;
    parallel_for(threads, n_blocks, [&](int, int64_t t) {
      const int64_t b = n_blocks - 1 - t, i0 = b * bs, i1 = std::min(n, i0 + bs);
      gram_rows_f(DotOrder::Interleaved, V, d, d, i0, i1, i1, G->g.data() + i0 * n, n);
      for (int64_t i = i0; i < i1; ++i) {
        double s = 0.0;
        for (int64_t j = 0; j < d; ++j) {
          const double x = V[i * d + j];
          s += x * x;  // exact products; the sum's rounding is far below the 1e-9 margin
        }
        G->g[static_cast<size_t>(i * n + i)] = s;
        G->norm[static_cast<size_t>(i)] = std::sqrt(s) * (1.0 + 1e-9);
      }
    });
    // the upper triangle from the lower (the entries are symmetric bit for bit), in tiles
    const int64_t ts = 64;
    parallel_for(threads, (n + ts - 1) / ts, [&](int, int64_t bi) {
      const int64_t i0 = bi * ts, i1 = std::min(n, i0 + ts);
      for (int64_t j0 = 0; j0 < i1; j0 += ts)
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t j = j0; j < std::min(i, j0 + ts); ++j)
            G->g[static_cast<size_t>(j * n + i)] = G->g[static_cast<size_t>(i * n + j)];
    });
    fd.gram = std::move(G);
    fd.gram_ready.store(true, std::memory_order_release);
  });
  return ready_gram(fd);
}

const WeightedGram* ready_weighted_gram(const FeatureData& fd, const double* inv) noexcept {
  if (!fd.wgram_ready.load(std::memory_order_acquire)) return nullptr;
  const WeightedGram* W = fd.wgram.get();
  if (!W || !std::equal(W->inv.begin(), W->inv.end(), inv)) return nullptr;
  return W;
}

const WeightedGram* build_weighted_gram(const FeatureData& fd, const double* inv, int threads) {
  if (!qualifies(fd)) return nullptr;
  std::call_once(fd.wgram_once, [&] {
    const int64_t n = fd.n, d = fd.d;
    std::unique_ptr<WeightedGram> W;
    std::vector<double> X, XW;
    try {
      W = std::make_unique<WeightedGram>();
      W->inv.assign(inv, inv + d);
      W->m.resize(static_cast<size_t>(n * n));
      X.resize(static_cast<size_t>(n * d));
      XW.resize(static_cast<size_t>(n * d));
    } catch (const std::bad_alloc&) {
      return;  // no memory for it: the solve computes its entries
    }
    for (int64_t i = 0; i < n * d; ++i) {
      X[i] = fd.p32[i];
      XW[i] = X[i] * inv[i % d];  // the solve's zl = z o inv
    }
    // rows of four against two columns at a time (dots2v: the bits of dots())
    parallel_for(threads, (n + 3) / 4, [&](int, int64_t g) {
      const int64_t i0 = 4 * g, i1 = std::min(n, i0 + 4);
      const int na = static_cast<int>(i1 - i0);
      const double* a[4];
      double o0[4], o1[4];
      for (int t = 0; t < na; ++t) a[t] = XW.data() + (i0 + t) * d;
      int64_t j = 0;
      for (; j + 1 < n; j += 2) {
        dots2v(DotOrder::Pairwise, a, na, X.data() + j * d, X.data() + (j + 1) * d, d, o0, o1);
        for (int t = 0; t < na; ++t) {
          W->m[static_cast<size_t>((i0 + t) * n + j)] = o0[t];
          W->m[static_cast<size_t>((i0 + t) * n + j + 1)] = o1[t];
        }
      }
      for (; j < n; ++j) {
        dots(DotOrder::Pairwise, a, na, X.data() + j * d, d, o0);
        for (int t = 0; t < na; ++t) W->m[static_cast<size_t>((i0 + t) * n + j)] = o0[t];
      }
    });
    fd.wgram = std::move(W);
    fd.wgram_ready.store(true, std::memory_order_release);
  });
  return ready_weighted_gram(fd, inv);
}

bool gram_top_k(const FeatureData& fd, const ItemGram& G, const float* U, const double* u,
                const int64_t* span, const double* coef, int64_t m, double u_err, int64_t k,
                const ExcludeLists& ex, float* out_s, int64_t* out_i) {
  const int64_t n = fd.n, d = fd.d;
  // |exact float32 score of item j - s_j| <= norm_j E + tiny, s_j = sum_t coef_t G[span_t][j]:
  //   float32 rescoring:         gamma32(d) ||x_j|| ||U|| + d 2^-149 (subnormal steps)
  //   U = float32(u):            ||x_j|| ||U - u||
  //   u vs sum_t coef_t x_t:     ||x_j|| u_err (the solver's rounding)
  //   G's entries and the sum:   (gamma(d + 2) + gamma(m + 2)) sum_t |coef_t| ||x_t|| ||x_j||
  //                              (1 + gamma), in double (Cauchy-Schwarz on |G_tj|)
  double uu = 0.0, du = 0.0, sc = 0.0;
  for (int64_t j = 0; j < d; ++j) {
    const double x = U[j], r = x - u[j];
    uu += x * x;
    du += r * r;
  }
  for (int64_t t = 0; t < m; ++t) sc += std::fabs(coef[t]) * G.norm[static_cast<size_t>(span[t])];
  const double eps = std::ldexp(1.0, -53);
  auto gamma = [&](double terms) { return terms * eps / (1.0 - terms * eps); };
  const double dd = static_cast<double>(d), mm = static_cast<double>(m);
  const double E = (float32_score_gamma(d) * std::sqrt(uu) * (1.0 + 1e-9) +
                    std::sqrt(du) * (1.0 + 1e-9) + u_err +
                    (gamma(dd + 2) + gamma(mm + 2)) * 1.01 * sc) *
                   (1.0 + 1e-6);
  const double tiny = dd * std::ldexp(1.0, -149) * 1.01;
  if (!std::isfinite(E)) return false;
  const int64_t bs = 1024;
  auto bounds = [&](int64_t r0, int64_t r1, double* s, double* e) {
    const int64_t nb = r1 - r0;
    std::fill(s, s + nb, 0.0);
    const double* g[4];
    for (int64_t t = 0; t < m; t += 4) {
      const int nr = static_cast<int>(std::min<int64_t>(4, m - t));
      for (int j = 0; j < nr; ++j) g[j] = G.g.data() + span[t + j] * n + r0;
      span_rows(g, coef + t, nr, nb, s);
    }
    for (int64_t x = 0; x < nb; ++x) e[x] = G.norm[static_cast<size_t>(r0 + x)] * E + tiny;
  };
  // a candidate costs its float32 row (4 d bytes) to rescore: past n / 8 of them the int8
  // pass is cheaper
  if (!bounded_top_k(fd, U, k, ex, bs, bounds, std::max<int64_t>(4 * k, n / 8), out_s, out_i))
    return false;
  fd.gram_topk.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace crossknn::detail
