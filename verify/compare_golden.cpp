#include "verify/compare_golden.hpp"

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "reference/error.hpp"

namespace qed::verify {

namespace {

class Fnv64 {
 public:
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) {
      h_ ^= b[i];
      h_ *= 0x100000001B3ull;
    }
  }
  void text(const std::string& s) { bytes(s.c_str(), s.size() + 1); }
  void i64(int64_t x) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(static_cast<uint64_t>(x) >> (8 * i));
    bytes(b, 8);
  }
  void f64(double x) {
    uint64_t u;
    std::memcpy(&u, &x, 8);
    i64(static_cast<int64_t>(u));
  }
  void array(const std::string& name, const std::vector<double>& x) {
    text(name);
    i64(static_cast<int64_t>(x.size()));
    for (double e : x) f64(e);
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xCBF29CE484222325ull;
};

bool bits_equal(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 8) == 0);
}

}  // namespace

std::string input_hash(const fixtures::Case& c) {
  const auto& in = c.inputs;
  Fnv64 h;
  h.text("qedcheck.inputs/1");
  h.text(std::string(reference::to_string(in.variant)));
  h.text(std::string(reference::to_string(in.arm)));
  for (int64_t d : {in.dims.B, in.dims.T, in.dims.H, in.dims.K, in.dims.V}) h.i64(d);
  h.f64(in.scale);
  h.array("q", in.q);
  h.array("k", in.k);
  h.array("v", in.v);
  h.array("g", in.g);
  h.array("b", in.b);
  h.array("w", in.w);
  h.array("beta", in.beta);
  h.array("lambda", in.lambda);
  h.array("r", in.r);
  h.array("h0", in.h0);
  h.text("cu_seqlens");
  h.i64(static_cast<int64_t>(in.cu_seqlens.size()));
  for (int64_t e : in.cu_seqlens) h.i64(e);
  return fmt::format("{:016x}", h.value());
}

bool same_inputs(const fixtures::Case& a, const fixtures::Case& b) {
  const auto& x = a.inputs;
  const auto& y = b.inputs;
  double sx = x.scale, sy = y.scale;
  return x.variant == y.variant && x.arm == y.arm && x.dims.B == y.dims.B && x.dims.T == y.dims.T &&
         x.dims.H == y.dims.H && x.dims.K == y.dims.K && x.dims.V == y.dims.V &&
         std::memcmp(&sx, &sy, 8) == 0 && bits_equal(x.q, y.q) && bits_equal(x.k, y.k) &&
         bits_equal(x.v, y.v) && bits_equal(x.g, y.g) && bits_equal(x.b, y.b) &&
         bits_equal(x.w, y.w) && bits_equal(x.beta, y.beta) && bits_equal(x.lambda, y.lambda) &&
         bits_equal(x.r, y.r) && bits_equal(x.h0, y.h0) && x.cu_seqlens == y.cu_seqlens;
}

bool same_cotangents(const fixtures::Case& a, const fixtures::Case& b) {
  if (!a.cotangents || !b.cotangents) return !a.cotangents && !b.cotangents;
  return bits_equal(a.cotangents->do_, b.cotangents->do_) &&
         bits_equal(a.cotangents->dht, b.cotangents->dht);
}

GoldenManifest read_golden_manifest(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kGoldenManifest).string();
  std::ifstream f(path);
  if (!f)
    throw qed::Error(path + ": cannot open the golden manifest (rule: a corpus folder holds the MANIFEST.json "
                            "that qedcheck golden --out writes)");
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw qed::Error(path + ": not valid JSON (" + e.what() + ")");
  }
  if (!doc.is_object() || doc.value("schema", "") != "qedcheck.golden/1")
    throw qed::Error(path + ": schema must be \"qedcheck.golden/1\"");
  GoldenManifest m;
  m.dir = dir;
  try {
    m.digits = doc.at("digits").get<double>();
    for (const auto& e : doc.at("cases")) {
      GoldenEntry g;
      g.name = e.at("name").get<std::string>();
      g.file = e.at("file").get<std::string>();
      g.input_hash = e.at("input_hash").get<std::string>();
      g.description = e.value("description", "");
      m.cases.push_back(std::move(g));
    }
  } catch (const nlohmann::json::exception& e) {
    throw qed::Error(path + ": malformed manifest (" + e.what() + ")");
  }
  return m;
}

std::optional<GoldenHit> find_golden(const std::string& dir, const fixtures::Case& c,
                                     bool need_cotangents) {
  if (dir.empty() || !std::filesystem::exists(std::filesystem::path(dir) / kGoldenManifest))
    return std::nullopt;
  const GoldenManifest m = read_golden_manifest(dir);
  const std::string h = input_hash(c);
  for (const auto& e : m.cases) {
    if (e.input_hash != h) continue;
    GoldenHit hit;
    hit.path = (std::filesystem::path(dir) / e.file).string();
    hit.name = e.name;
    hit.c = fixtures::read_case(hit.path);
    if (!same_inputs(hit.c, c)) continue;
    if (need_cotangents && !same_cotangents(hit.c, c)) continue;
    return hit;
  }
  return std::nullopt;
}

}  // namespace qed::verify
