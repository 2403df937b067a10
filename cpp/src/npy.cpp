// A small .npy reader: header parsing, read-only memory maps, small float arrays.
#include "crossknn/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>

namespace crossknn {

const char* npy_dtype_name(NpyDtype t) noexcept {
  switch (t) {
    case NpyDtype::Float32:
      return "float32";
    case NpyDtype::Float16:
      return "float16";
    case NpyDtype::Int8:
      return "int8";
    case NpyDtype::Float64:
      return "float64";
    default:
      return "int64";
  }
}

int npy_dtype_size(NpyDtype t) noexcept {
  switch (t) {
    case NpyDtype::Float32:
      return 4;
    case NpyDtype::Float16:
      return 2;
    case NpyDtype::Int8:
      return 1;
    default:
      return 8;
  }
}

int64_t NpyHeader::count() const {
  int64_t c = 1;
  for (int64_t s : shape) {
    if (s < 0) throw std::invalid_argument("npy shape has a negative dimension");
    if (s != 0 && c > std::numeric_limits<int64_t>::max() / s)
      throw std::length_error("npy shape overflows");
    c *= s;
  }
  return c;
}

namespace {

// value of `key` in the header dict: the text after "'key':" up to the matching end
std::string dict_value(const std::string& h, const std::string& key, const std::string& what) {
  const std::string k = "'" + key + "'";
  size_t p = h.find(k);
  if (p == std::string::npos) throw std::invalid_argument(what + ": npy header has no " + k);
  p = h.find(':', p + k.size());
  if (p == std::string::npos) throw std::invalid_argument(what + ": malformed npy header");
  ++p;
  while (p < h.size() && h[p] == ' ') ++p;
  if (p >= h.size()) throw std::invalid_argument(what + ": malformed npy header");
  size_t e;
  if (h[p] == '\'') {
    e = h.find('\'', p + 1);
    if (e == std::string::npos) throw std::invalid_argument(what + ": malformed npy header");
    return h.substr(p + 1, e - p - 1);
  }
  if (h[p] == '(') {
    e = h.find(')', p);
    if (e == std::string::npos) throw std::invalid_argument(what + ": malformed npy header");
    return h.substr(p, e - p + 1);
  }
  e = h.find_first_of(",}", p);
  if (e == std::string::npos) throw std::invalid_argument(what + ": malformed npy header");
  std::string v = h.substr(p, e - p);
  while (!v.empty() && v.back() == ' ') v.pop_back();
  return v;
}

}  // namespace

NpyHeader parse_npy_header(const char* buf, size_t len, const std::string& what) {
  static const char magic[] = "\x93NUMPY";
  if (len < 10 || std::memcmp(buf, magic, 6) != 0)
    throw std::invalid_argument(what + ": not a .npy file (no \\x93NUMPY magic)");
  const int major = static_cast<unsigned char>(buf[6]);
  size_t hlen, start;
  if (major == 1) {
    hlen = static_cast<unsigned char>(buf[8]) |
           (static_cast<size_t>(static_cast<unsigned char>(buf[9])) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (len < 12) throw std::invalid_argument(what + ": truncated npy header");
    hlen = 0;
    for (int i = 0; i < 4; ++i)
      hlen |= static_cast<size_t>(static_cast<unsigned char>(buf[8 + i])) << (8 * i);
    start = 12;
  } else {
    throw std::invalid_argument(what + ": npy format version " + std::to_string(major) +
                                ".x is not supported (expected 1.0, 2.0 or 3.0)");
  }
  if (start + hlen > len) throw std::invalid_argument(what + ": truncated npy header");
  const std::string h(buf + start, hlen);
  NpyHeader out;
  out.data_offset = static_cast<int64_t>(start + hlen);

  const std::string descr = dict_value(h, "descr", what);
  if (descr == "<f4" || descr == "=f4")
    out.dtype = NpyDtype::Float32;
  else if (descr == "<f2" || descr == "=f2")
    out.dtype = NpyDtype::Float16;
  else if (descr == "|i1" || descr == "<i1" || descr == "=i1")
    out.dtype = NpyDtype::Int8;
  else if (descr == "<f8" || descr == "=f8")
    out.dtype = NpyDtype::Float64;
  else if (descr == "<i8" || descr == "=i8")
    out.dtype = NpyDtype::Int64;
  else
    throw std::invalid_argument(what + ": dtype '" + descr +
                                "' is not supported (expected little-endian float32 '<f4', "
                                "float16 '<f2', int8 '|i1', float64 '<f8' or int64 '<i8')");
  const std::string fo = dict_value(h, "fortran_order", what);
  if (fo != "False")
    throw std::invalid_argument(what +
                                ": array is in Fortran order; expected C order "
                                "(save np.ascontiguousarray(a))");
  const std::string shape = dict_value(h, "shape", what);  // "(3, 4)" / "(5,)" / "()"
  size_t p = 1;
  while (p < shape.size()) {
    while (p < shape.size() && (shape[p] == ' ' || shape[p] == ',')) ++p;
    if (p >= shape.size() || shape[p] == ')') break;
    size_t used = 0;
    long long v;
    try {
      v = std::stoll(shape.substr(p), &used);
    } catch (const std::exception&) {
      throw std::invalid_argument(what + ": malformed npy shape " + shape);
    }
    if (v < 0 || used == 0) throw std::invalid_argument(what + ": malformed npy shape " + shape);
    out.shape.push_back(v);
    p += used;
  }
  out.count();  // overflow check
  return out;
}

NpyHeader read_npy_header(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  std::string buf(12, '\0');
  f.read(&buf[0], 12);
  const size_t got = static_cast<size_t>(f.gcount());
  if (got < 10) throw std::invalid_argument(path + ": not a .npy file (too short)");
  const int major = static_cast<unsigned char>(buf[6]);
  size_t hlen = major == 1 ? (static_cast<unsigned char>(buf[8]) |
                              (static_cast<size_t>(static_cast<unsigned char>(buf[9])) << 8)) +
                                 10
                           : 0;
  if (major == 2 || major == 3) {
    hlen = 12;
    for (int i = 0; i < 4; ++i)
      hlen += static_cast<size_t>(static_cast<unsigned char>(buf[8 + i])) << (8 * i);
  }
  if (hlen > (1u << 26)) throw std::invalid_argument(path + ": npy header is implausibly large");
  size_t total = got;
  if (hlen > got) {
    buf.resize(hlen);
    f.read(&buf[got], static_cast<std::streamsize>(hlen - got));
    total = got + static_cast<size_t>(f.gcount());
  }
  return parse_npy_header(buf.data(), total, path);
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw std::runtime_error("cannot stat " + path + ": " + std::strerror(e));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      throw std::runtime_error("cannot map " + path + ": " + std::strerror(e));
    }
    data_ = static_cast<const char*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<char*>(data_), size_);
}

NpyMap map_npy(const std::string& path) {
  NpyMap m;
  m.file = std::make_shared<const MappedFile>(path);
  m.header = parse_npy_header(m.file->data(), m.file->size(), path);
  const int64_t bytes = m.header.count() * npy_dtype_size(m.header.dtype);
  if (m.header.data_offset + bytes > static_cast<int64_t>(m.file->size()))
    throw std::invalid_argument(path + ": file is truncated (" + std::to_string(m.file->size()) +
                                " bytes; the header promises " +
                                std::to_string(m.header.data_offset + bytes) + ")");
  if (m.header.data_offset % npy_dtype_size(m.header.dtype) != 0)
    throw std::invalid_argument(path + ": npy data is not aligned for its dtype");
  return m;
}

std::vector<float> load_npy_float32(const std::string& path, std::vector<int64_t>* shape) {
  NpyMap m = map_npy(path);
  const int64_t c = m.header.count();
  std::vector<float> out(static_cast<size_t>(c));
  switch (m.header.dtype) {
    case NpyDtype::Float32:
      std::memcpy(out.data(), m.data(), static_cast<size_t>(c) * 4);
      break;
    case NpyDtype::Float64: {
      const double* p = static_cast<const double*>(m.data());
      for (int64_t i = 0; i < c; ++i) out[i] = static_cast<float>(p[i]);
      break;
    }
    default:
      throw std::invalid_argument(path + ": expected a float32 or float64 array; got " +
                                  npy_dtype_name(m.header.dtype));
  }
  if (shape) *shape = m.header.shape;
  return out;
}

}  // namespace crossknn
