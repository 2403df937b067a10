#pragma once
// A small JSON reader for index.json (private to the core): values keep their number tokens as
// written, so that the canonical text Python's crossknn.fileio.json_bytes writes (indent 2, keys
// sorted, ASCII escapes) can be rebuilt for the meta_sha256 check.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace crossknn {
namespace detail {

struct Json {
  enum Type { Null, Bool, Number, String, Array, Object };
  Type type = Null;
  bool b = false;
  std::string text;  // Number: the token as written; String: the decoded UTF-8 value
  std::vector<Json> items;                           // Array
  std::vector<std::pair<std::string, Json>> fields;  // Object, in file order

  const Json* get(const std::string& key) const;  // nullptr when absent (or not an object)
  bool is_int() const;                            // a number token without '.', 'e', 'E'
  int64_t as_int(const std::string& what) const;  // std::invalid_argument when not an int
  double as_double(const std::string& what) const;
  const std::string& as_string(const std::string& what) const;
};

// Parses a whole document; std::invalid_argument "WHAT: ... at line L column C" on bad input.
Json parse_json(const std::string& text, const std::string& what);
// json.dumps(value, indent=2, sort_keys=True) (ensure_ascii): numbers as their tokens
std::string canonical_json(const Json& value);

// SHA-256 (FIPS 180-4) of a byte range, as 64 lowercase hex digits.
std::string sha256_hex(const void* data, size_t n);

}  // namespace detail
}  // namespace crossknn
