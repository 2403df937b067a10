// crossknn::Index and crossknn::Searcher (issue 68): the pinned fixture folders Python wrote
// (fixtures/make_index_fixtures.py), the reader's refusals of damaged folders, a hot swap, and
// concurrent searches.  test_index FIXTURES_DIR TMP_DIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../src/index_json.h"
#include "check.h"
#include "crossknn/crossknn.h"

namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void spit(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
}

// the open error's message, or "" when it opened
std::string open_error(const fs::path& dir) {
  try {
    crossknn::Index::open(dir.string());
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

class Row final : public crossknn::Scorer {
 public:
  explicit Row(std::vector<float> s) : s_(std::move(s)) {}
  void score(int64_t, const int64_t* items, int64_t m, float* out) override {
    for (int64_t t = 0; t < m; ++t) out[t] = s_[items[t]];
  }

 private:
  std::vector<float> s_;
};

std::vector<float> npy_floats(const fs::path& p) { return crossknn::load_npy_float32(p.string()); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: test_index FIXTURES_DIR TMP_DIR\n");
    return 2;
  }
  const fs::path fx = argv[1], tmp = argv[2];
  fs::remove_all(tmp);
  fs::create_directories(tmp);

  // SHA-256 test vectors (FIPS 180-2)
  CHECK(crossknn::detail::sha256_hex("abc", 3) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(crossknn::detail::sha256_hex("", 0) ==
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  CHECK(crossknn::detail::sha256_hex(two.data(), two.size()) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");

  const std::string million(1000000, 'a');  // many blocks (the SHA-NI path where the CPU has it)
  CHECK(crossknn::detail::sha256_hex(million.data(), million.size()) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");

  // the pinned fixture files
  {
    std::istringstream sums(slurp(fx / "SHA256SUMS"));
    std::string line;
    int n = 0;
    while (std::getline(sums, line)) {
      if (line.size() < 67) continue;
      const std::string want = line.substr(0, 64), rel = line.substr(66);
      const std::string data = slurp(fx / rel);
      if (crossknn::detail::sha256_hex(data.data(), data.size()) != want) {
        std::fprintf(stderr, "fixture %s differs from its pinned hash (regenerate: "
                             "make_index_fixtures.py)\n", rel.c_str());
        ++failures;
      }
      ++n;
    }
    CHECK(n > 20);
  }

  // what a default build holds
  auto idx = crossknn::Index::open((fx / "index_default" / "index").string());
  CHECK(idx->n_items() == 1000 && idx->dim() == 16 && idx->version() == 1);
  CHECK(idx->ids()[0] == "d0" && idx->ids()[999] == "d999");
  CHECK(idx->default_method() == "auto" && idx->live() == nullptr && idx->n_removed() == 0);
  CHECK(idx->round_index() == "exact");
  const auto& lang = idx->column("lang");
  CHECK(lang.kind == "string" && lang.dictionary() == (std::vector<std::string>{"de", "en", "fr"}));
  CHECK(lang.code("en") == 1 && lang.code("xx") == -1 && lang.codes()[0] == 1);  // item 0: en
  CHECK(idx->column("year").kind == "number" && idx->column("year").numbers()[3] == 2003.0);
  CHECK(idx->column("tags").kind == "strings" && idx->column("tags").offsets()[1] == 2);
  CHECK(throws<std::runtime_error>([&] { idx->column("nope"); }));
  CHECK(idx->positions({"d5", "zz"}) == (std::vector<int64_t>{5, -1}));
  CHECK(has(idx->params_json(), "\"auto\": {"));

  // the edited index: version 4, removed items as a mask
  auto ed = crossknn::Index::open((fx / "index_edited" / "index").string());
  CHECK(ed->version() == 4 && ed->n_removed() == 30 && ed->live() != nullptr);
  CHECK(ed->n_items() == 1040 && !crossknn::mask_allows(ed->live(), 0));
  CHECK(ed->positions({"d0", "d1", "a3"})[0] == -1 && ed->positions({"d1"})[0] == 1);

  // a search of the default index equals the example's pinned answer (expected.txt line 1)
  const fs::path d0 = fx / "index_default";
  const std::vector<float> q0 = npy_floats(d0 / "q0.npy"), s0 = npy_floats(d0 / "s0.npy");
  crossknn::Searcher searcher(idx);
  crossknn::SearchRequest req;
  req.query_vector = q0.data();
  Row ce(s0);
  const crossknn::Hits ref = searcher.search(ce, req);
  {
    std::string first = slurp(d0 / "expected.txt");
    first = first.substr(first.find(" | ") + 3);
    char buf[64];
    std::snprintf(buf, sizeof buf, "1 %s %.9g;", idx->ids()[ref.indices[0]].c_str(),
                  static_cast<double>(ref.scores[0]));
    CHECK(first.compare(0, std::string(buf).size(), buf) == 0);
    CHECK(ref.ce_calls == 100 && ref.indices.size() == 10);
  }

  // concurrent searches on one Searcher give the same answer
  {
    std::vector<crossknn::Hits> got(4);
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&, t] {
        Row sc(s0);
        got[t] = searcher.search(sc, req);
      });
    for (auto& t : ts) t.join();
    for (const auto& h : got) CHECK(h.indices == ref.indices && h.scores == ref.scores);
  }

  // refusals: one line naming the file
  auto copy = [&](const std::string& name) {
    const fs::path to = tmp / name;
    fs::copy(fx / "index_default" / "index", to, fs::copy_options::recursive);
    return to;
  };
  {
    const fs::path p = copy("corrupt");
    std::string b = slurp(p / "de_items.npy");
    b[b.size() - 3] ^= 0x40;
    spit(p / "de_items.npy", b);
    const std::string e = open_error(p);
    CHECK(has(e, "de_items.npy is corrupt (content hash mismatch"));
    CHECK(crossknn::Index::open(p.string(), false)->n_items() == 1000);  // verify off: opens
  }
  {
    const fs::path p = copy("missing");
    fs::remove(p / "auto_rows.npy");
    CHECK(has(open_error(p), "array file auto_rows.npy is missing"));
  }
  {
    const fs::path p = copy("truncated");
    std::string b = slurp(p / "auto_item_cov.npy");
    spit(p / "auto_item_cov.npy", b.substr(0, b.size() - 8));
    CHECK(has(open_error(p), "auto_item_cov.npy holds"));
  }
  {
    const fs::path p = copy("edited_json");
    std::string j = slurp(p / "index.json");
    const size_t at = j.find("\"rounds\": 30");
    CHECK(at != std::string::npos);
    j.replace(at, 12, "\"rounds\": 31");
    spit(p / "index.json", j);
    CHECK(has(open_error(p), "index.json was modified after the index was built"));
    j = slurp(fx / "index_default" / "index" / "index.json");
    j.insert(j.find('{') + 1, "\n\n  ");  // whitespace only: the same document
    spit(p / "index.json", j);
    CHECK(open_error(p).empty());
  }
  {
    const fs::path p = copy("items");
    std::string t = slurp(p / "items.jsonl");
    t[10] = t[10] == 'x' ? 'y' : 'x';
    spit(p / "items.jsonl", t);
    CHECK(has(open_error(p), "items.jsonl does not match the recorded hash"));
  }
  CHECK(has(open_error(tmp / "nowhere"), "index.json is missing"));

  // a hot swap: the old Index keeps answering from its version while the folder moves on
  {
    const fs::path p = copy("swap");
    auto old_index = crossknn::Index::open(p.string());
    crossknn::Searcher old_searcher(old_index);
    for (const auto& e : fs::directory_iterator(p)) fs::remove(e.path());  // the old files go
    for (const auto& e : fs::directory_iterator(fx / "index_edited" / "index"))
      if (e.path().filename() != "index.json") fs::copy(e.path(), p / e.path().filename());
    fs::copy(fx / "index_edited" / "index" / "index.json", p / "index.json.tmp");
    fs::rename(p / "index.json.tmp", p / "index.json");  // the commit
    Row sc(s0);
    const crossknn::Hits again = old_searcher.search(sc, req);
    CHECK(again.indices == ref.indices && again.scores == ref.scores);
    auto now = crossknn::Index::open(p.string());
    CHECK(now->version() == 4 && old_index->version() == 1 && now->n_items() == 1040);
  }

  // a FAISS round index is refused for AXN unless exact rounds are asked for
  {
    const fs::path p = copy("faiss");
    std::string j = slurp(p / "index.json");
    // the params' round index kind; the meta hash is dropped (an index written before it)
    const size_t m = j.find("  \"meta_sha256\"");
    j.erase(m, j.find('\n', m) - m + 1);
    const size_t k = j.find("\"kind\": \"exact\"", j.find("\"round_index\": {"));
    j.replace(k, 17, "\"kind\": \"ivf\"");
    spit(p / "index.json", j);
    auto fi = crossknn::Index::open(p.string());
    CHECK(fi->round_index() == "ivf");
    crossknn::Searcher s1(fi);
    crossknn::SearchRequest r = req;
    r.method = "axn";
    Row sc(s0);
    std::string e;
    try {
      s1.search(sc, r);
    } catch (const std::exception& x) {
      e = x.what();
    }
    CHECK(has(e, "FAISS round index (ivf)") && has(e, "round_index = \"exact\""));
    crossknn::SearcherOptions o;
    o.round_index = "exact";
    crossknn::Searcher s2(fi, o);
    CHECK(s2.search(sc, r).ce_calls == 100);
    r.method = "";  // auto never uses it
    CHECK(s1.search(sc, r).indices == ref.indices);
  }
  // a caller's mask: no disallowed item is scored or returned
  {
    std::vector<uint64_t> allow(static_cast<size_t>(crossknn::mask_words(1000)), 0);
    const auto& codes = idx->column("lang").codes();
    const int32_t en = idx->column("lang").code("en");
    for (int64_t i = 0; i < 1000; ++i)
      if (codes[i] == en) allow[i >> 6] |= uint64_t{1} << (i & 63);
    crossknn::SearchRequest r = req;
    r.allow = allow.data();
    Row sc(s0);
    const crossknn::Hits h = searcher.search(sc, r);
    CHECK(h.allowed == 334 && h.ce_calls == 100);
    for (int64_t i : h.scored_items) CHECK(codes[i] == en);
  }
  if (failures) std::fprintf(stderr, "%d checks failed\n", failures);
  return failures != 0;
}
