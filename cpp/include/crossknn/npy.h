#pragma once
// crossknn/npy.h: a small reader for NumPy .npy files (format versions 1.0, 2.0 and 3.0), enough
// to open an index's arrays from C++: little-endian, C order, dtypes float32 ('<f4'), float16
// ('<f2'), int8 ('|i1'), float64 ('<f8') and int64 ('<i8'). Anything else is refused with a
// message saying what was found. No pickle, no object arrays.
//
// Threads: MappedFile is immutable after construction; its const calls may run concurrently.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace crossknn {

enum class NpyDtype { Float32, Float16, Int8, Float64, Int64 };
const char* npy_dtype_name(NpyDtype t) noexcept;  // "float32", ...
int npy_dtype_size(NpyDtype t) noexcept;

struct NpyHeader {
  NpyDtype dtype = NpyDtype::Float32;
  std::vector<int64_t> shape;  // () for a scalar
  int64_t data_offset = 0;     // byte offset of the data in the file
  int64_t count() const;       // product of shape (overflow-checked)
};

// Parses the header at the start of `buf` (len bytes). Throws std::invalid_argument saying what
// was expected and what came (bad magic, big-endian, Fortran order, unsupported dtype, ...).
NpyHeader parse_npy_header(const char* buf, size_t len, const std::string& what = "npy file");
// Reads the header of a file (std::runtime_error when the file cannot be read).
NpyHeader read_npy_header(const std::string& path);

// A whole file mapped read-only (POSIX mmap). The mapping lives until the object is destroyed.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const char* data() const noexcept { return data_; }
  size_t size() const noexcept { return size_; }
  const std::string& path() const noexcept { return path_; }

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// A .npy file mapped read-only, header parsed and sizes checked against the file length.
struct NpyMap {
  std::shared_ptr<const MappedFile> file;
  NpyHeader header;
  const void* data() const noexcept { return file->data() + header.data_offset; }
};
NpyMap map_npy(const std::string& path);

// Reads a (small) float array fully into memory as float32; float64/float16 are converted,
// other dtypes refused. `shape` (optional) receives the array's shape.
std::vector<float> load_npy_float32(const std::string& path, std::vector<int64_t>* shape = nullptr);

}  // namespace crossknn
