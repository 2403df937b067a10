#pragma once
// crossknn/index.h: a corpus index folder as Python's `crossknn build` / `add` / `remove` /
// `refine` write it, opened read-only from C++ (one format, two readers).
//
//   auto index = crossknn::Index::open("INDEX_DIR");   // std::shared_ptr<const Index>
//
// open() reads index.json (format crossknn-index 1, kind "corpus"), checks its recorded
// meta_sha256 (a hand edit is refused) and memory-maps every array it lists: each file's npy
// dtype and shape against the recorded ones, its byte size, and (verify = true) its sha256
// against the recorded hash. The item ids come from the version's items file (its sha256
// checked too). Every failure is one std::runtime_error line naming the file and what was
// expected ("INDEX_DIR/de_items.npy is corrupt (content hash mismatch): ..."); nothing aborts.
//
// Versions. `add` / `remove` / `refine` write a new version's files beside the old ones and
// commit by renaming index.json. An Index is the version whose index.json it read: its maps
// keep that version's files readable after a commit unlinks them (POSIX), so searches on an
// old Index finish on the old version while Index::open(dir) again gives the new one (a commit
// between reading index.json and mapping its files is retried). The removed items of the
// version (its `tombstones`) are an allow mask every search applies.
//
// Threads. An Index is immutable after open(); every const call may run concurrently.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "crossknn/npy.h"

namespace crossknn {

// One array of the index: mapped read-only, its numpy dtype string ("<f4", "|u1", "<i8", ...)
// and shape as recorded.
struct IndexArray {
  std::string name, file, dtype, sha256;  // sha256: the recorded content hash
  std::vector<int64_t> shape;
  std::shared_ptr<const MappedFile> map;
  int64_t offset = 0;  // of the data in the file
  const void* data() const noexcept { return map->data() + offset; }
  int64_t count() const noexcept;  // number of values
  // typed views; std::runtime_error naming the array when the dtype differs
  const float* f32() const;
  const double* f64() const;
  const int64_t* i64() const;
  const int32_t* i32() const;
  const int8_t* i8() const;
  const uint8_t* u8() const;
};

// A metadata field of the items (crossknn.metadata): kind "string", "strings", "number",
// "bool" or "date", its arrays by part name ("codes", "values", "ms", "offsets", "present",
// "dict_bytes", "dict_offsets").
class MetadataColumn {
 public:
  std::string name, kind;
  std::map<std::string, const IndexArray*> parts;
  const IndexArray& part(const std::string& p) const;
  // string / strings: the sorted distinct values; code(value) their position, -1 when absent
  std::vector<std::string> dictionary() const;
  int32_t code(const std::string& value) const;
  const int32_t* codes() const { return part("codes").i32(); }  // string: -1 missing
  const double* numbers() const { return part("values").f64(); }  // number: NaN missing
  const int8_t* bools() const { return part("values").i8(); }     // bool: -1 missing, 0, 1
  const int64_t* dates_ms() const { return part("ms").i64(); }    // date: INT64_MIN missing
  const int64_t* offsets() const { return part("offsets").i64(); }  // strings: N + 1
  const int8_t* present() const { return part("present").i8(); }    // strings
};

class Index {
 public:
  // Opens the current version of the folder `dir` (see above). verify = false skips the
  // content hashes (sizes, dtypes and shapes are still checked).
  static std::shared_ptr<const Index> open(const std::string& dir, bool verify = true);

  const std::string& path() const noexcept { return path_; }
  int64_t version() const noexcept { return version_; }
  int64_t n_items() const noexcept { return n_items_; }
  int64_t dim() const noexcept { return dim_; }
  const std::vector<std::string>& ids() const noexcept { return ids_; }
  int64_t ce_calls() const noexcept { return ce_calls_; }

  bool has(const std::string& array) const { return arrays_.count(array) != 0; }
  const IndexArray& array(const std::string& name) const;  // std::runtime_error when absent
  std::vector<std::string> array_names() const;

  // The removed items (tombstones) as an allow mask of the live items (mask_words(N) words,
  // crossknn/features.h); null when no item is removed.
  const uint64_t* live() const noexcept { return live_.empty() ? nullptr : live_.data(); }
  int64_t n_removed() const noexcept { return n_removed_; }

  // The methods this index serves (those of Python's registry that need no Python model) and
  // the default one ("auto" when the index has auto's rows, else "axn"). `gar` is served when
  // the index holds GAR's corpus graph made from its current de_items (Python computes a
  // missing or stale one at first use; the C++ searcher refuses gar then).
  std::vector<std::string> methods() const;
  const std::string& default_method() const noexcept { return default_method_; }
  // The index's round index kind: "exact" or a FAISS kind ("ivf", "hnsw").
  const std::string& round_index() const noexcept { return round_index_; }

  // Metadata fields (params.metadata) by name
  std::vector<std::string> fields() const;
  const MetadataColumn& column(const std::string& name) const;  // std::runtime_error if absent
  // The position of each item id (-1 for an id the index does not hold, or a removed one)
  std::vector<int64_t> positions(const std::vector<std::string>& ids) const;

  // index.json's params and info as canonical JSON text (what Python's json_bytes writes)
  std::string params_json() const;
  std::string info_json() const;

  // Parsed settings read by crossknn::Searcher (index.json params); private layout.
  struct Settings;
  const Settings& settings() const noexcept { return *settings_; }
  ~Index();

 private:
  Index() = default;
  std::string path_;
  int64_t version_ = 1, n_items_ = 0, dim_ = 0, ce_calls_ = 0, n_removed_ = 0;
  std::vector<std::string> ids_;
  std::map<std::string, IndexArray> arrays_;
  std::map<std::string, MetadataColumn> columns_;
  std::vector<uint64_t> live_;
  std::string default_method_, round_index_ = "exact";
  std::shared_ptr<const void> doc_;  // the parsed index.json
  std::unique_ptr<Settings> settings_;
  friend struct IndexOpener;
};

}  // namespace crossknn
