// Opening an index folder (crossknn/index.h).
#include "crossknn/index.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "crossknn/features.h"
#include "index_json.h"
#include "index_settings.h"

namespace crossknn {

using detail::Json;

int64_t IndexArray::count() const noexcept {
  int64_t c = 1;
  for (int64_t s : shape) c *= s;
  return c;
}

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::runtime_error(msg); }

const void* typed(const IndexArray& a, const char* want, const char* what) {
  if (a.dtype != want)
    fail("index array " + a.name + " (" + a.file + ") has dtype " + a.dtype + "; " + what + " (" +
         want + ") expected");
  return a.data();
}

}  // namespace

const float* IndexArray::f32() const { return static_cast<const float*>(typed(*this, "<f4", "float32")); }
const double* IndexArray::f64() const { return static_cast<const double*>(typed(*this, "<f8", "float64")); }
const int64_t* IndexArray::i64() const { return static_cast<const int64_t*>(typed(*this, "<i8", "int64")); }
const int32_t* IndexArray::i32() const { return static_cast<const int32_t*>(typed(*this, "<i4", "int32")); }
const int8_t* IndexArray::i8() const { return static_cast<const int8_t*>(typed(*this, "|i1", "int8")); }
const uint8_t* IndexArray::u8() const { return static_cast<const uint8_t*>(typed(*this, "|u1", "uint8")); }

const IndexArray& MetadataColumn::part(const std::string& p) const {
  auto it = parts.find(p);
  if (it == parts.end())
    fail("metadata field " + name + " (" + kind + ") has no '" + p + "' array");
  return *it->second;
}

std::vector<std::string> MetadataColumn::dictionary() const {
  const IndexArray& b = part("dict_bytes");
  const IndexArray& o = part("dict_offsets");
  const uint8_t* bytes = b.u8();
  const int64_t* off = o.i64();
  std::vector<std::string> out;
  for (int64_t j = 0; j + 1 < o.count(); ++j) {
    if (off[j] < 0 || off[j + 1] < off[j] || off[j + 1] > b.count())
      fail("metadata field " + name + ": dict_offsets out of range");
    out.emplace_back(reinterpret_cast<const char*>(bytes) + off[j],
                     static_cast<size_t>(off[j + 1] - off[j]));
  }
  return out;
}

int32_t MetadataColumn::code(const std::string& value) const {
  const auto d = dictionary();
  auto it = std::lower_bound(d.begin(), d.end(), value);
  return it != d.end() && *it == value ? static_cast<int32_t>(it - d.begin()) : -1;
}

struct IndexOpener {
  static std::string read_file(const std::string& path, bool* missing) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
      if (missing) *missing = true;
      return {};
    }
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
  }

  // npy header: descr, fortran order, shape, data offset
  static void npy_header(const MappedFile& m, const std::string& what, IndexArray& a,
                         std::string& descr, std::vector<int64_t>& shape) {
    const char* buf = m.data();
    const size_t len = m.size();
    if (len < 10 || std::memcmp(buf, "\x93NUMPY", 6) != 0)
      fail(what + " is corrupt or truncated (not a .npy file)");
    const int major = static_cast<unsigned char>(buf[6]);
    size_t hlen = 0, start = 10;
    if (major == 1) {
      hlen = static_cast<unsigned char>(buf[8]) | (static_cast<size_t>(static_cast<unsigned char>(buf[9])) << 8);
    } else if ((major == 2 || major == 3) && len >= 12) {
      for (int i = 0; i < 4; ++i) hlen |= static_cast<size_t>(static_cast<unsigned char>(buf[8 + i])) << (8 * i);
      start = 12;
    } else {
      fail(what + " has an unsupported .npy version " + std::to_string(major));
    }
    if (start + hlen > len) fail(what + " is corrupt or truncated (short header)");
    const std::string h(buf + start, hlen);
    a.offset = static_cast<int64_t>(start + hlen);
    auto value = [&](const std::string& key) {
      const size_t p = h.find("'" + key + "':");
      if (p == std::string::npos) fail(what + ": npy header has no '" + key + "'");
      size_t q = p + key.size() + 3;
      while (q < h.size() && h[q] == ' ') ++q;
      return q;
    };
    size_t q = value("descr");
    if (q >= h.size() || h[q] != '\'') fail(what + ": malformed npy header");
    const size_t e = h.find('\'', q + 1);
    if (e == std::string::npos) fail(what + ": malformed npy header");
    descr = h.substr(q + 1, e - q - 1);
    q = value("fortran_order");
    if (h.compare(q, 5, "False") != 0) fail(what + " is in Fortran order; C order expected");
    q = value("shape");
    if (q >= h.size() || h[q] != '(') fail(what + ": malformed npy shape");
    const size_t close = h.find(')', q);
    if (close == std::string::npos) fail(what + ": malformed npy shape");
    shape.clear();
    std::string dims = h.substr(q + 1, close - q - 1);
    std::stringstream ss(dims);
    std::string tok;
    while (std::getline(ss, tok, ',')) {
      tok.erase(0, tok.find_first_not_of(' '));
      tok.erase(tok.find_last_not_of(' ') + 1);
      if (tok.empty()) continue;
      if (tok.find_first_not_of("0123456789") != std::string::npos) fail(what + ": malformed npy shape");
      shape.push_back(std::stoll(tok));
    }
  }

  static std::string shape_str(const std::vector<int64_t>& s) {
    std::string o = "[";
    for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
    return o + "]";
  }

  static int itemsize(const std::string& descr) {
    if (descr.size() < 3) return 0;
    const std::string t = descr.substr(1);
    if (t == "f4" || t == "i4" || t == "u4") return 4;
    if (t == "f8" || t == "i8" || t == "u8") return 8;
    if (t == "f2" || t == "i2" || t == "u2") return 2;
    if (t == "i1" || t == "u1" || t == "b1") return 1;
    return 0;
  }

  // one attempt; `stale` is set when index.json changed under us (a commit: retry)
  static std::shared_ptr<const Index> attempt(const std::string& dir, bool verify,
                                              bool* stale) {
    const std::string meta = dir + "/index.json";
    bool missing = false;
    const std::string text = read_file(meta, &missing);
    if (missing) fail(dir + " is not an index: index.json is missing (or unreadable)");
    auto doc = std::make_shared<Json>(detail::parse_json(text, meta));
    if (doc->type != Json::Object) fail(meta + ": expected a JSON object");
    const Json* fmt = doc->get("format");
    if (!fmt || fmt->type != Json::String || fmt->text != "crossknn-index")
      fail(meta + ": expected format 'crossknn-index'");
    const Json* fv = doc->get("format_version");
    if (!fv || !fv->is_int() || fv->text != "1")
      fail(meta + ": format_version " + (fv ? fv->text : std::string("(none)")) +
           " is not supported (this crossknn reads version 1); rebuild the index");
    for (const char* key : {"kind", "arrays", "models", "params", "ce_calls", "info"})
      if (!doc->get(key)) fail(meta + ": missing key '" + std::string(key) + "'");
    const Json& kind = *doc->get("kind");
    if (kind.type != Json::String || kind.text != "corpus")
      fail(dir + " is a '" + (kind.type == Json::String ? kind.text : std::string("?")) +
           "' index; expected a 'corpus' index (crossknn build)");
    if (const Json* h = doc->get("meta_sha256")) {
      Json rest = *doc;
      rest.fields.erase(std::remove_if(rest.fields.begin(), rest.fields.end(),
                                       [](const auto& f) { return f.first == "meta_sha256"; }),
                        rest.fields.end());
      const std::string canon = detail::canonical_json(rest) + "\n";
      if (h->type != Json::String || detail::sha256_hex(canon.data(), canon.size()) != h->text)
        fail(meta + ": index.json was modified after the index was built (its recorded "
                    "meta_sha256 does not match); rebuild the index");
    }
    const Json& arrays = *doc->get("arrays");
    const Json& params = *doc->get("params");
    const Json& info = *doc->get("info");
    if (arrays.type != Json::Object || arrays.fields.empty())
      fail(meta + ": 'arrays' must be a non-empty object");
    if (params.type != Json::Object || info.type != Json::Object)
      fail(meta + ": 'params' and 'info' must be objects");
    std::shared_ptr<Index> idx(new Index());
    idx->path_ = dir;
    idx->doc_ = doc;
    idx->ce_calls_ = doc->get("ce_calls")->as_int(meta + ": ce_calls");
    auto changed = [&] {
      bool gone = false;
      return read_file(meta, &gone) != text;
    };
    for (const auto& f : arrays.fields) {
      const std::string& name = f.first;
      const Json& ent = f.second;
      const Json* file = ent.get("file");
      const Json* dtype = ent.get("dtype");
      const Json* shape = ent.get("shape");
      const Json* sha = ent.get("sha256");
      if (!file || file->type != Json::String || !dtype || dtype->type != Json::String || !shape ||
          shape->type != Json::Array || !sha || sha->type != Json::String)
        fail(meta + ": arrays." + name + " must be {file, dtype, shape, sha256}");
      if (file->text.find('/') != std::string::npos || file->text.size() < 5 ||
          file->text.compare(file->text.size() - 4, 4, ".npy") != 0)
        fail(meta + ": arrays." + name + ".file '" + file->text + "' must be a plain .npy name");
      IndexArray a;
      a.name = name;
      a.file = file->text;
      a.dtype = dtype->text;
      a.sha256 = sha->text;
      for (const Json& s : shape->items) a.shape.push_back(s.as_int(meta + ": arrays." + name + ".shape"));
      const std::string where = dir + "/" + a.file;
      std::shared_ptr<const MappedFile> map;
      try {
        map = std::make_shared<const MappedFile>(where);
      } catch (const std::exception&) {
        if (changed()) {
          *stale = true;
          return nullptr;
        }
        fail("index " + dir + ": array file " + a.file + " is missing (or unreadable)");
      }
      std::string descr;
      std::vector<int64_t> got;
      npy_header(*map, where, a, descr, got);
      if (descr != a.dtype || got != a.shape) {
        if (changed()) {
          *stale = true;
          return nullptr;
        }
        fail("index " + dir + ": " + a.file + " has dtype " + descr + " shape " + shape_str(got) +
             ", index.json expects dtype " + a.dtype + " shape " + shape_str(a.shape));
      }
      const int isz = itemsize(a.dtype);
      if (isz == 0) fail("index " + dir + ": " + a.file + " has dtype " + a.dtype + ", which this reader does not know");
      const int64_t bytes = a.count() * isz;
      const int64_t have = static_cast<int64_t>(map->size()) - a.offset;
      if (have != bytes) {
        if (changed()) {
          *stale = true;
          return nullptr;
        }
        fail("index " + dir + ": " + a.file + " holds " + std::to_string(have) +
             " data bytes; its dtype and shape need " + std::to_string(bytes) + " (truncated or corrupt)");
      }
      a.map = map;
      if (verify && detail::sha256_hex(a.data(), static_cast<size_t>(bytes)) != sha->text) {
        if (changed()) {
          *stale = true;
          return nullptr;
        }
        fail("index " + dir + ": " + a.file + " is corrupt (content hash mismatch: recorded " +
             sha->text.substr(0, 12) + "...)");
      }
      idx->arrays_.emplace(name, std::move(a));
    }
    // the items: ids from the version's items file
    std::string items_file = "items.jsonl";
    if (const Json* it = info.get("items_file")) items_file = it->as_string(meta + ": info.items_file");
    if (items_file.find('/') != std::string::npos) fail(meta + ": info.items_file must be a plain file name");
    bool gone = false;
    const std::string items = read_file(dir + "/" + items_file, &gone);
    if (gone) {
      if (changed()) {
        *stale = true;
        return nullptr;
      }
      fail("index " + dir + ": " + items_file + " (the item texts) is missing");
    }
    if (verify) {
      const Json* want = info.get("items_sha256");
      if (!want || want->type != Json::String ||
          detail::sha256_hex(items.data(), items.size()) != want->text) {
        if (changed()) {
          *stale = true;
          return nullptr;
        }
        fail("index " + dir + ": " + items_file +
             " does not match the recorded hash (changed or corrupt); rebuild the index");
      }
    }
    size_t p = 0;
    int64_t line = 0;
    while (p < items.size()) {
      size_t e = items.find('\n', p);
      if (e == std::string::npos) e = items.size();
      ++line;
      const std::string rec = items.substr(p, e - p);
      p = e + 1;
      if (rec.find_first_not_of(" \r\t") == std::string::npos) continue;
      const Json j = detail::parse_json(rec, dir + "/" + items_file + " line " + std::to_string(line));
      const Json* id = j.get("id");
      if (!id || id->type != Json::String)
        fail("index " + dir + ": " + items_file + " line " + std::to_string(line) + " has no string id");
      idx->ids_.push_back(id->text);
    }
    if (!idx->has("de_items")) fail("index " + dir + ": index.json lists no de_items array");
    const IndexArray& V = idx->array("de_items");
    if (V.shape.size() != 2 || V.dtype != "<f4")
      fail("index " + dir + ": de_items must be a float32 (N x d) matrix; got dtype " + V.dtype +
           " shape " + shape_str(V.shape));
    idx->n_items_ = V.shape[0];
    idx->dim_ = V.shape[1];
    if (static_cast<int64_t>(idx->ids_.size()) != idx->n_items_)
      fail("index " + dir + ": " + std::to_string(idx->ids_.size()) + " items but " +
           std::to_string(idx->n_items_) + " vectors");
    if (const Json* v = info.get("version"))
      if (v->is_int() && v->as_int("info.version") >= 1) idx->version_ = v->as_int("info.version");
    if (idx->has("tombstones")) {
      const IndexArray& t = idx->array("tombstones");
      if (t.count() != idx->n_items_ || itemsize(t.dtype) != 1)
        fail("index " + dir + ": tombstones must hold one byte per item");
      const uint8_t* dead = static_cast<const uint8_t*>(t.data());
      std::vector<uint64_t> live(static_cast<size_t>(mask_words(idx->n_items_)), 0);
      for (int64_t i = 0; i < idx->n_items_; ++i) {
        if (dead[i])
          ++idx->n_removed_;
        else
          live[i >> 6] |= uint64_t{1} << (i & 63);
      }
      if (idx->n_removed_) idx->live_ = std::move(live);
    }
    // metadata fields
    if (const Json* md = params.get("metadata")) {
      if (const Json* fields = md->get("fields")) {
        for (const Json& fj : fields->items) {
          MetadataColumn c;
          c.name = fj.get("name") ? fj.get("name")->as_string("metadata field name") : "";
          c.kind = fj.get("kind") ? fj.get("kind")->as_string("metadata field kind") : "";
          const int64_t col = fj.get("column") ? fj.get("column")->as_int("metadata column") : -1;
          const std::string prefix = "meta" + std::to_string(col) + "_";
          for (const auto& a : idx->arrays_)
            if (a.first.compare(0, prefix.size(), prefix) == 0)
              c.parts[a.first.substr(prefix.size())] = &a.second;
          if (c.parts.empty())
            fail("index " + dir + ": metadata field '" + c.name + "' has no arrays");
          idx->columns_.emplace(c.name, std::move(c));
        }
      }
    }
    // the settings the searcher reads
    auto st = std::make_unique<Index::Settings>();
    const std::string pw = meta + ": params.";
    if (const Json* a = params.get("auto"); a && a->type == Json::Object) {
      st->has_auto = true;
      auto num = [&](const char* key, double def) {
        const Json* v = a->get(key);
        return v && v->type == Json::Number ? v->as_double(pw + "auto." + key) : def;
      };
      st->rho_d = num("rho_d", 0.3);
      st->rho_r = num("rho_r", 0.3);
      st->rounds = a->get("rounds") ? a->get("rounds")->as_int(pw + "auto.rounds") : 10;
      const Json* fs = a->get("first_share");
      st->has_first_share = fs && fs->type == Json::Number;
      st->first_share = st->has_first_share ? fs->as_double(pw + "auto.first_share") : 0.0;
      st->decay = num("decay", 0.0);
      st->prior_alpha = idx->has("auto_row_vectors") ? num("prior_alpha", 0.0) : 0.0;
      st->prior_tau = num("prior_tau", 10.0);
      st->prior_ridge = num("prior_ridge", 0.0);
      st->prior_kernel_tau = num("prior_kernel_tau", 2.0);
      if (const Json* sc = a->get("stop_curve"); sc && sc->type == Json::Object)
        if (const Json* bb = sc->get("by_budget"); bb && bb->type == Json::Object)
          for (const auto& b : bb->fields) {
            std::vector<std::pair<double, double>> table;
            if (const Json* th = b.second.get("thresholds"); th && th->type == Json::Object)
              for (const auto& t : th->fields)
                table.emplace_back(std::strtod(t.first.c_str(), nullptr),
                                   t.second.as_double(pw + "auto.stop_curve.by_budget"));
            std::sort(table.begin(), table.end());
            st->stop_table.emplace_back(std::strtoll(b.first.c_str(), nullptr, 10),
                                        std::move(table));
          }
    }
    auto pair = [&](const Json* v, const std::string& what) {
      if (!v || v->type != Json::Array || v->items.size() != 2 ||
          v->items[0].type != Json::Number || v->items[1].type != Json::Number)
        fail(pw + what + " must be [scale, offset]");
      st->has_score_map = true;
      st->score_scale = v->items[0].as_double(what);
      st->score_offset = v->items[1].as_double(what);
    };
    const Json* sm = params.get("score_map");
    const Json* sa = params.get("score_affine");
    const Json* nz = params.get("normalize");
    if (sm && sm->type != Json::Null) {
      pair(sm, "score_map");
    } else if (sa && sa->type != Json::Null) {
      pair(sa, "score_affine");
    } else if (nz && nz->type == Json::Bool && nz->b && params.get("alpha") && params.get("beta")) {
      st->has_score_map = true;
      st->score_scale = 1.0 / params.get("beta")->as_double("params.beta");
      st->score_offset = params.get("alpha")->as_double("params.alpha");
    }
    if (st->has_score_map && !(std::isfinite(st->score_scale) && std::isfinite(st->score_offset) &&
                               std::fabs(st->score_scale) >= 1e-12 && std::fabs(st->score_scale) <= 1e12 &&
                               std::fabs(st->score_offset) <= 1e12))
      fail(pw + "score_map is out of range");
    st->has_cur = idx->has("R");
    if (idx->has("gar_graph")) {  // crossknn.index.graph.graph_of_index's rule (k = 16)
      const IndexArray& g = idx->array("gar_graph");
      const Json* gp = params.get("gar_graph");
      const Json* vs = gp ? gp->get("de_items_sha256") : nullptr;
      const int64_t n = idx->n_items_;
      st->has_gar_graph = g.shape.size() == 2 && g.shape[0] == n &&
                          g.shape[1] == std::min<int64_t>(16, n - 1) &&
                          (g.dtype == "<i8" || g.dtype == "<i4") && vs &&
                          vs->type == Json::String && vs->text == idx->array("de_items").sha256;
    }
    if (const Json* ri = params.get("round_index"); ri && ri->type == Json::Object)
      if (const Json* k = ri->get("kind"); k && k->type == Json::String) idx->round_index_ = k->text;
    idx->default_method_ = st->has_auto ? "auto" : "axn";
    idx->settings_ = std::move(st);
    return idx;
  }
};

std::shared_ptr<const Index> Index::open(const std::string& dir_in, bool verify) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  for (int attempt = 0;; ++attempt) {
    bool stale = false;
    auto idx = IndexOpener::attempt(dir, verify, &stale);
    if (idx) return idx;
    if (attempt >= 20)
      fail("index " + dir + ": index.json kept changing while it was opened (20 tries)");
  }
}

Index::~Index() = default;

const IndexArray& Index::array(const std::string& name) const {
  auto it = arrays_.find(name);
  if (it == arrays_.end()) fail("index " + path_ + " has no array '" + name + "'");
  return it->second;
}

std::vector<std::string> Index::array_names() const {
  std::vector<std::string> out;
  for (const auto& a : arrays_) out.push_back(a.first);
  return out;
}

std::vector<std::string> Index::methods() const {
  std::vector<std::string> out;
  if (settings_->has_auto) out.push_back("auto");
  out.push_back("axn");
  out.push_back("rnr");
  if (settings_->has_cur)
    for (const char* m : {"adacur", "adacur-split", "adacur-softmax", "adacur-random", "anncur"})
      out.push_back(m);
  if (settings_->has_gar_graph) out.push_back("gar");
  return out;
}

std::vector<std::string> Index::fields() const {
  std::vector<std::string> out;
  for (const auto& c : columns_) out.push_back(c.first);
  return out;
}

const MetadataColumn& Index::column(const std::string& name) const {
  auto it = columns_.find(name);
  if (it == columns_.end()) {
    std::string have;
    for (const auto& c : columns_) have += (have.empty() ? "" : ", ") + c.first;
    fail("index " + path_ + " has no metadata field '" + name + "' (fields: " +
         (have.empty() ? "none" : have) + ")");
  }
  return it->second;
}

std::vector<int64_t> Index::positions(const std::vector<std::string>& ids) const {
  std::unordered_map<std::string, int64_t> pos;
  pos.reserve(ids_.size());
  for (size_t j = 0; j < ids_.size(); ++j) pos[ids_[j]] = static_cast<int64_t>(j);
  std::vector<int64_t> out;
  out.reserve(ids.size());
  for (const auto& id : ids) {
    auto it = pos.find(id);
    int64_t j = it == pos.end() ? -1 : it->second;
    if (j >= 0 && !mask_allows(live(), j)) j = -1;
    out.push_back(j);
  }
  return out;
}

std::string Index::params_json() const {
  return detail::canonical_json(*static_cast<const Json*>(doc_.get())->get("params"));
}

std::string Index::info_json() const {
  return detail::canonical_json(*static_cast<const Json*>(doc_.get())->get("info"));
}

}  // namespace crossknn
