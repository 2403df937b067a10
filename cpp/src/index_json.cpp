// index.json's reader and canonical writer, and SHA-256 (cpp/src/index_json.h).
#include "index_json.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace crossknn {
namespace detail {

const Json* Json::get(const std::string& key) const {
  if (type != Object) return nullptr;
  const Json* hit = nullptr;  // json.loads keeps the last of repeated keys
  for (const auto& f : fields)
    if (f.first == key) hit = &f.second;
  return hit;
}

bool Json::is_int() const {
  return type == Number && text.find_first_of(".eE") == std::string::npos;
}

int64_t Json::as_int(const std::string& what) const {
  if (!is_int()) throw std::invalid_argument(what + " must be an integer; got " + (type == Number ? text : "a non-number"));
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') throw std::invalid_argument(what + " is out of the 64-bit range: " + text);
  return v;
}

double Json::as_double(const std::string& what) const {
  if (type != Number) throw std::invalid_argument(what + " must be a number");
  return std::strtod(text.c_str(), nullptr);
}

const std::string& Json::as_string(const std::string& what) const {
  if (type != String) throw std::invalid_argument(what + " must be a string");
  return text;
}

namespace {

class Parser {
 public:
  Parser(const std::string& s, const std::string& what) : s_(s), what_(what) {}

  Json document() {
    Json v = value(0);
    ws();
    if (p_ != s_.size()) fail("extra data after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < p_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw std::invalid_argument(what_ + " is not valid JSON: " + msg + " at line " +
                                std::to_string(line) + " column " + std::to_string(col));
  }
  void ws() {
    while (p_ < s_.size() && (s_[p_] == ' ' || s_[p_] == '\n' || s_[p_] == '\r' || s_[p_] == '\t'))
      ++p_;
  }
  bool lit(const char* w) {
    const size_t n = std::strlen(w);
    if (s_.compare(p_, n, w) != 0) return false;
    p_ += n;
    return true;
  }
  Json value(int depth) {
    if (depth > 512) fail("nesting deeper than 512");
    ws();
    if (p_ >= s_.size()) fail("unexpected end");
    Json v;
    const char c = s_[p_];
    if (c == '{') {
      v.type = Json::Object;
      ++p_;
      ws();
      if (p_ < s_.size() && s_[p_] == '}') {
        ++p_;
        return v;
      }
      for (;;) {
        ws();
        if (p_ >= s_.size() || s_[p_] != '"') fail("expected a string key");
        std::string key = string();
        ws();
        if (p_ >= s_.size() || s_[p_] != ':') fail("expected ':'");
        ++p_;
        v.fields.emplace_back(std::move(key), value(depth + 1));
        ws();
        if (p_ < s_.size() && s_[p_] == ',') {
          ++p_;
          continue;
        }
        if (p_ < s_.size() && s_[p_] == '}') {
          ++p_;
          return v;
        }
        fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.type = Json::Array;
      ++p_;
      ws();
      if (p_ < s_.size() && s_[p_] == ']') {
        ++p_;
        return v;
      }
      for (;;) {
        v.items.push_back(value(depth + 1));
        ws();
        if (p_ < s_.size() && s_[p_] == ',') {
          ++p_;
          continue;
        }
        if (p_ < s_.size() && s_[p_] == ']') {
          ++p_;
          return v;
        }
        fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.type = Json::String;
      v.text = string();
      return v;
    }
    if (lit("true")) {
      v.type = Json::Bool;
      v.b = true;
      return v;
    }
    if (lit("false")) {
      v.type = Json::Bool;
      return v;
    }
    if (lit("null")) return v;
    if (c == '-' || (c >= '0' && c <= '9')) {
      const size_t b = p_;
      if (s_[p_] == '-') ++p_;
      auto digits = [&] {
        const size_t d0 = p_;
        while (p_ < s_.size() && s_[p_] >= '0' && s_[p_] <= '9') ++p_;
        if (p_ == d0) fail("malformed number");
      };
      digits();
      if (p_ < s_.size() && s_[p_] == '.') {
        ++p_;
        digits();
      }
      if (p_ < s_.size() && (s_[p_] == 'e' || s_[p_] == 'E')) {
        ++p_;
        if (p_ < s_.size() && (s_[p_] == '+' || s_[p_] == '-')) ++p_;
        digits();
      }
      v.type = Json::Number;
      v.text = s_.substr(b, p_ - b);
      return v;
    }
    fail("unexpected character");
  }
  unsigned hex4() {
    if (p_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned u = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[p_++];
      u <<= 4;
      if (h >= '0' && h <= '9')
        u |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f')
        u |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F')
        u |= static_cast<unsigned>(h - 'A' + 10);
      else
        fail("bad \\u escape");
    }
    return u;
  }
  static void put_utf8(unsigned cp, std::string& out) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  std::string string() {
    ++p_;  // the opening quote
    std::string out;
    for (;;) {
      if (p_ >= s_.size()) fail("unterminated string");
      const char c = s_[p_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p_ >= s_.size()) fail("unterminated string");
      const char e = s_[p_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && p_ + 6 <= s_.size() && s_[p_] == '\\' &&
              s_[p_ + 1] == 'u') {
            const size_t save = p_;
            p_ += 2;
            const unsigned lo = hex4();
            if (lo >= 0xDC00 && lo < 0xE000)
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else
              p_ = save;
          }
          put_utf8(cp, out);
          break;
        }
        default:
          fail("bad escape");
      }
    }
  }

  const std::string& s_;
  const std::string& what_;
  size_t p_ = 0;
};

void put_u(unsigned u, std::string& out) {
  static const char* hex = "0123456789abcdef";
  out += "\\u";
  for (int s = 12; s >= 0; s -= 4) out += hex[(u >> s) & 15];
}

// json.dumps' ensure_ascii string: short escapes, \u00XX controls, \uXXXX (pairs) beyond ASCII
void dump_string(const std::string& s, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20)
            put_u(c, out);
          else
            out += static_cast<char>(c);
      }
      continue;
    }
    unsigned cp;
    int n;
    if ((c & 0xE0) == 0xC0) {
      cp = c & 0x1F;
      n = 1;
    } else if ((c & 0xF0) == 0xE0) {
      cp = c & 0x0F;
      n = 2;
    } else {
      cp = c & 0x07;
      n = 3;
    }
    ++i;
    for (int t = 0; t < n && i < s.size(); ++t, ++i)
      cp = (cp << 6) | (static_cast<unsigned char>(s[i]) & 0x3F);
    if (cp >= 0x10000) {
      cp -= 0x10000;
      put_u(0xD800 + (cp >> 10), out);
      put_u(0xDC00 + (cp & 0x3FF), out);
    } else {
      put_u(cp, out);
    }
  }
  out += '"';
}

void dump(const Json& v, int level, std::string& out) {
  const std::string pad(static_cast<size_t>(2 * (level + 1)), ' ');
  const std::string end(static_cast<size_t>(2 * level), ' ');
  switch (v.type) {
    case Json::Null: out += "null"; return;
    case Json::Bool: out += v.b ? "true" : "false"; return;
    case Json::Number: out += v.text; return;
    case Json::String: dump_string(v.text, out); return;
    case Json::Array:
      if (v.items.empty()) {
        out += "[]";
        return;
      }
      out += "[\n";
      for (size_t i = 0; i < v.items.size(); ++i) {
        if (i) out += ",\n";
        out += pad;
        dump(v.items[i], level + 1, out);
      }
      out += "\n" + end + "]";
      return;
    case Json::Object: {
      if (v.fields.empty()) {
        out += "{}";
        return;
      }
      // the last of repeated keys, then sorted by code point (UTF-8 byte order)
      std::vector<const std::pair<std::string, Json>*> order;
      for (const auto& f : v.fields) {
        bool later = false;
        for (const auto& g : v.fields)
          if (&g > &f && g.first == f.first) later = true;
        if (!later) order.push_back(&f);
      }
      std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
        return std::lexicographical_compare(
            a->first.begin(), a->first.end(), b->first.begin(), b->first.end(),
            [](char x, char y) { return static_cast<unsigned char>(x) < static_cast<unsigned char>(y); });
      });
      out += "{\n";
      for (size_t i = 0; i < order.size(); ++i) {
        if (i) out += ",\n";
        out += pad;
        dump_string(order[i]->first, out);
        out += ": ";
        dump(order[i]->second, level + 1, out);
      }
      out += "\n" + end + "}";
      return;
    }
  }
}

// ---- SHA-256 ---------------------------------------------------------------------------------
constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void block(uint32_t h[8], const unsigned char* p) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = (uint32_t{p[4 * i]} << 24) | (uint32_t{p[4 * i + 1]} << 16) |
           (uint32_t{p[4 * i + 2]} << 8) | uint32_t{p[4 * i + 3]};
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kK[i] + w[i];
    const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += k;
}

#if defined(__x86_64__)
// The blocks with the SHA extensions (SHA-NI; Intel's and AMD's since Zen): the same digest,
// several times faster than the portable rounds above on the index's arrays
__attribute__((target("sha,sse4.1,ssse3"))) void blocks_shani(uint32_t h[8],
                                                              const unsigned char* p,
                                                              size_t n_blocks) {
  const __m128i mask = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i tmp = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&h[0]));
  __m128i s1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&h[4]));
  tmp = _mm_shuffle_epi32(tmp, 0xB1);     // CDAB
  s1 = _mm_shuffle_epi32(s1, 0x1B);       // EFGH
  __m128i s0 = _mm_alignr_epi8(tmp, s1, 8);  // ABEF
  s1 = _mm_blend_epi16(s1, tmp, 0xF0);    // CDGH
  for (size_t b = 0; b < n_blocks; ++b, p += 64) {
    const __m128i abef = s0, cdgh = s1;
    __m128i w[16];
    for (int g = 0; g < 4; ++g)
      w[g] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * g)), mask);
    for (int g = 4; g < 16; ++g)
      w[g] = _mm_sha256msg2_epu32(
          _mm_add_epi32(_mm_sha256msg1_epu32(w[g - 4], w[g - 3]), _mm_alignr_epi8(w[g - 1], w[g - 2], 4)),
          w[g - 1]);
    for (int g = 0; g < 16; ++g) {
      __m128i msg = _mm_add_epi32(w[g], _mm_loadu_si128(reinterpret_cast<const __m128i*>(kK + 4 * g)));
      s1 = _mm_sha256rnds2_epu32(s1, s0, msg);
      msg = _mm_shuffle_epi32(msg, 0x0E);
      s0 = _mm_sha256rnds2_epu32(s0, s1, msg);
    }
    s0 = _mm_add_epi32(s0, abef);
    s1 = _mm_add_epi32(s1, cdgh);
  }
  tmp = _mm_shuffle_epi32(s0, 0x1B);     // FEBA
  s1 = _mm_shuffle_epi32(s1, 0xB1);      // DCHG
  s0 = _mm_blend_epi16(tmp, s1, 0xF0);   // DCBA
  s1 = _mm_alignr_epi8(s1, tmp, 8);      // ABEF
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&h[0]), s0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&h[4]), s1);
}

bool has_shani() {
  static const bool on = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 19)) || !(c & (1u << 9))) return false;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return (b & (1u << 29)) != 0;
  }();
  return on;
}
#endif

}  // namespace

Json parse_json(const std::string& text, const std::string& what) {
  return Parser(text, what).document();
}

std::string canonical_json(const Json& value) {
  std::string out;
  dump(value, 0, out);
  return out;
}

std::string sha256_hex(const void* data, size_t n) {
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  const unsigned char* p = static_cast<const unsigned char*>(data);
  size_t full = n / 64;
#if defined(__x86_64__)
  if (has_shani())
    blocks_shani(h, p, full);
  else
#endif
    for (size_t i = 0; i < full; ++i) block(h, p + 64 * i);
  unsigned char tail[128] = {0};
  const size_t rest = n - 64 * full;
  if (rest) std::memcpy(tail, p + 64 * full, rest);
  tail[rest] = 0x80;
  const size_t len = rest + 1 + 8 <= 64 ? 64 : 128;
  const uint64_t bits = static_cast<uint64_t>(n) * 8;
  for (int i = 0; i < 8; ++i) tail[len - 1 - i] = static_cast<unsigned char>(bits >> (8 * i));
  block(h, tail);
  if (len == 128) block(h, tail + 64);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (uint32_t x : h)
    for (int s = 28; s >= 0; s -= 4) out += hex[(x >> s) & 15];
  return out;
}

}  // namespace detail
}  // namespace crossknn
