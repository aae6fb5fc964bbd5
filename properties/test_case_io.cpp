// Case files: write_case/read_case round trips for every variant and arm with every optional
// part, interoperability with h5py (examples/python/write_case.py), atomic writing.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "fixtures/case.hpp"
#include "fixtures/generate.hpp"

namespace {

using namespace qed::fixtures;
using qed::reference::Arm;
using qed::reference::Variant;
namespace fs = std::filesystem;

// A fresh folder per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    static int n = 0;
    path_ = fs::temp_directory_path() /
            ("qedcheck-case-io-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

struct Parts {
  bool h0 = false, varlen = false, cot = false, dht = false, results = false, lo = false,
       digits = false;
};

std::vector<double> noise(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<double> x(n);
  for (auto& e : x) e = rng.normal();
  return x;
}

Case make_case(Variant v, Arm a, const Parts& p, uint64_t seed) {
  GenSpec s;
  s.variant = v;
  s.arm = a;
  s.seed = seed;
  s.dims = {p.varlen ? 1 : 2, 7, 2, 3, 5};
  if (p.varlen) s.seqlens = {3, 0, 4};
  s.with_h0 = p.h0;
  Case c;
  c.inputs = generate(s);
  c.dtype = "float32";
  if (p.cot) c.cotangents = generate_cotangents(c.inputs, seed, p.dht);
  if (p.results) {
    c.producer = "test_case_io seed " + std::to_string(seed);
    std::vector<std::string> outs = {"o", "ht"};
    for (const auto& n : outs) {
      Dataset d;
      d.shape = input_shape(c.inputs, n);
      d.data =
          noise(static_cast<size_t>(d.shape[0] * d.shape[1] * d.shape[2] * d.shape[3]), seed + 1);
      if (p.lo) d.lo = noise(d.data.size(), seed + 2);
      if (p.digits) d.digits = 15.5;
      c.outputs[n] = d;
    }
    uint64_t k = 3;
    for (const auto& n : grad_names(v, a)) {
      Dataset d;
      d.shape = input_shape(c.inputs, n);
      size_t count = 1;
      for (auto e : d.shape) count *= static_cast<size_t>(e);
      d.data = noise(count, seed + k++);
      if (p.lo) d.lo = noise(count, seed + k++);
      if (p.digits) d.digits = static_cast<double>(k);
      c.grads[n] = d;
    }
  }
  return c;
}

void expect_same(const Case& a, const Case& b) {
  const auto &x = a.inputs, &y = b.inputs;
  EXPECT_EQ(x.variant, y.variant);
  EXPECT_EQ(x.arm, y.arm);
  EXPECT_EQ(x.dims.B, y.dims.B);
  EXPECT_EQ(x.dims.T, y.dims.T);
  EXPECT_EQ(x.dims.H, y.dims.H);
  EXPECT_EQ(x.dims.K, y.dims.K);
  EXPECT_EQ(x.dims.V, y.dims.V);
  EXPECT_EQ(std::memcmp(&x.scale, &y.scale, sizeof(double)), 0);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.producer, b.producer);
  for (auto m : {&qed::reference::Inputs<double>::q, &qed::reference::Inputs<double>::k,
                 &qed::reference::Inputs<double>::v, &qed::reference::Inputs<double>::g,
                 &qed::reference::Inputs<double>::b, &qed::reference::Inputs<double>::w,
                 &qed::reference::Inputs<double>::beta, &qed::reference::Inputs<double>::lambda,
                 &qed::reference::Inputs<double>::r, &qed::reference::Inputs<double>::h0})
    EXPECT_TRUE(same_bits(x.*m, y.*m));
  EXPECT_EQ(x.cu_seqlens, y.cu_seqlens);
  ASSERT_EQ(a.cotangents.has_value(), b.cotangents.has_value());
  if (a.cotangents) {
    EXPECT_TRUE(same_bits(a.cotangents->do_, b.cotangents->do_));
    EXPECT_TRUE(same_bits(a.cotangents->dht, b.cotangents->dht));
  }
  for (auto [ma, mb] : {std::pair{&a.outputs, &b.outputs}, std::pair{&a.grads, &b.grads}}) {
    ASSERT_EQ(ma->size(), mb->size());
    for (const auto& [n, d] : *ma) {
      ASSERT_TRUE(mb->count(n)) << n;
      const auto& e = mb->at(n);
      EXPECT_EQ(d.shape, e.shape) << n;
      EXPECT_TRUE(same_bits(d.data, e.data)) << n;
      EXPECT_TRUE(same_bits(d.lo, e.lo)) << n;
      EXPECT_EQ(d.digits, e.digits) << n;
    }
  }
}

struct VariantArm {
  Variant v;
  Arm a;
};
const VariantArm kAll[] = {{Variant::gdn2, Arm::none},  {Variant::qed, Arm::full},
                           {Variant::qed, Arm::nogate}, {Variant::qed, Arm::nogate_noproj},
                           {Variant::qed, Arm::rand},   {Variant::kda, Arm::none},
                           {Variant::gdn, Arm::none},   {Variant::deltanet, Arm::none}};

TEST(CaseIo, RoundTripEveryVariantArmAndPart) {
  TempDir dir;
  const Parts parts[] = {
      {},
      {.h0 = true},
      {.varlen = true},
      {.h0 = true, .varlen = true, .cot = true},
      {.cot = true, .dht = true},
      {.h0 = true, .varlen = true, .cot = true, .dht = true, .results = true},
      {.results = true, .lo = true},
      {.h0 = true, .cot = true, .dht = true, .results = true, .lo = true, .digits = true},
      {.varlen = true, .results = true, .digits = true}};
  uint64_t seed = 100;
  for (const auto& va : kAll) {
    for (size_t i = 0; i < std::size(parts); ++i, ++seed) {
      SCOPED_TRACE("variant " + std::string(to_string(va.v)) + " arm " +
                   std::string(to_string(va.a)) + " parts #" + std::to_string(i) + " seed " +
                   std::to_string(seed));
      const Case c = make_case(va.v, va.a, parts[i], seed);
      const std::string path = dir.file("rt.h5");
      write_case(path, c);
      const Case r = read_case(path);
      EXPECT_EQ(r.path, path);
      expect_same(c, r);
    }
  }
}

TEST(CaseIo, RoundTripKeepsNonFiniteResultsAndAdversarialInputsWhenAsked) {
  TempDir dir;
  Case c = make_case(Variant::gdn2, Arm::none, {.results = true, .lo = true}, 7);
  c.outputs["o"].data[3] = std::nan("");
  c.grads["dg"].lo[0] = -INFINITY;
  c.inputs.g[1] = 0.5;  // breaks g <= 0: writable, readable only without value checks
  write_case(dir.file("a.h5"), c);
  ReadOptions loose;
  loose.check_values = false;
  expect_same(c, read_case(dir.file("a.h5"), loose));
  EXPECT_THROW(read_case(dir.file("a.h5")), qed::Error);
}

TEST(CaseIo, WriteReplacesExistingFileAndLeavesNoTemporary) {
  TempDir dir;
  const std::string path = dir.file("x.h5");
  write_case(path, make_case(Variant::kda, Arm::none, {}, 1));
  const Case second = make_case(Variant::deltanet, Arm::none, {.h0 = true}, 2);
  write_case(path, second);
  expect_same(second, read_case(path));
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    ++files;
    EXPECT_EQ(e.path().filename(), "x.h5");
  }
  EXPECT_EQ(files, 1u);
}

TEST(CaseIo, WriteToReadOnlyFolderFailsCleanly) {
  TempDir dir;
  const fs::path ro = dir.path() / "ro";
  fs::create_directories(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec, fs::perm_options::replace);
  // Root ignores permission bits; /sys refuses new files even to root.
  const std::string folder = ::geteuid() == 0 ? std::string("/sys") : ro.string();
  const std::string path = folder + "/case.h5";
  const Case c = make_case(Variant::qed, Arm::full, {}, 3);
  try {
    write_case(path, c);
    FAIL() << "write_case into read-only " << folder << " succeeded";
  } catch (const qed::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("rule: the output folder must exist and be writable"), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(fs::is_empty(ro));
}

TEST(CaseIo, WriteIntoMissingFolderFailsCleanly) {
  TempDir dir;
  const std::string path = dir.file("no/such/folder/case.h5");
  try {
    write_case(path, make_case(Variant::gdn, Arm::none, {}, 4));
    FAIL() << "write_case into a missing folder succeeded";
  } catch (const qed::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos)
        << e.what();
  }
}

TEST(CaseIo, WriteRejectsInconsistentCaseAndWritesNothing) {
  TempDir dir;
  Case c = make_case(Variant::gdn2, Arm::none, {}, 5);
  c.inputs.w.pop_back();
  const std::string path = dir.file("bad.h5");
  try {
    write_case(path, c);
    FAIL() << "inconsistent case written";
  } catch (const qed::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path + ": /inputs/w: 139 values, expected 140 = [2,7,2,5] [B,T,H,V]"),
              std::string::npos)
        << m;
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

// Every array the h5py script wrote, from its raw little-endian dump, against what read_case
// returned: bit-exact, and nothing missing on either side.
template <class T>
std::vector<T> read_raw(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<T> x(bytes.size() / sizeof(T));
  std::memcpy(x.data(), bytes.data(), x.size() * sizeof(T));
  return x;
}

struct PyCase {
  std::string variant, arm, extra;
};

TEST(CaseIo, ReadsH5pyCasesBitExact) {
  TempDir dir;
  const PyCase cases[] = {
      {"gdn2", "", "--B 2 --T 5 --H 2 --K 3 --V 4 --results"},
      {"qed", "full", "--h0 --cotangents --dht --results --dtype float32"},
      {"qed", "nogate", "--B 1 --T 6 --seqlens 2,0,4 --h0 --fixed-strings --results"},
      {"qed", "nogate_noproj", "--dtype float16 --cotangents"},
      {"qed", "rand", "--results --digits 0 --fixed-strings --dtype bfloat16"},
      {"kda", "", "--cotangents --results --h0"},
      {"gdn", "", "--B 1 --T 9 --seqlens 4,0,5 --h0 --cotangents --dht --results --fixed-strings"},
      {"deltanet", "", "--K 1 --V 1 --T 1 --scale 0.3 --results"},
  };
  int seed = 11;
  for (const auto& pc : cases) {
    const std::string tag = pc.variant + (pc.arm.empty() ? "" : "-" + pc.arm);
    const std::string out = dir.file(tag + ".h5"), raw = dir.file(tag + "-raw");
    const std::string cmd = std::string(QEDCHECK_PYTHON) + " " + QEDCHECK_SOURCE_DIR +
                            "/examples/python/write_case.py --variant " + pc.variant +
                            (pc.arm.empty() ? "" : " --arm " + pc.arm) + " --seed " +
                            std::to_string(seed++) + " " + pc.extra + " --out " + out +
                            " --dump-raw " + raw;
    SCOPED_TRACE("replay: " + cmd);
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    const Case c = read_case(out);
    EXPECT_EQ(std::string(to_string(c.inputs.variant)), pc.variant);
    EXPECT_EQ(std::string(to_string(c.inputs.arm)), pc.arm.empty() ? "none" : pc.arm);
    const auto scale = read_raw<double>(fs::path(raw) / "root_scale.bin");
    ASSERT_EQ(scale.size(), 1u);
    EXPECT_EQ(std::memcmp(&scale[0], &c.inputs.scale, sizeof(double)), 0);
    const auto pos = pc.extra.find("--dtype ");
    EXPECT_EQ(c.dtype, pos == std::string::npos
                           ? "float64"
                           : pc.extra.substr(pos + 8, pc.extra.find(' ', pos + 8) - pos - 8));
    EXPECT_EQ(c.producer.empty(), pc.extra.find("--results") == std::string::npos);
    const auto& in = c.inputs;
    std::map<std::string, const std::vector<double>*> arrays = {
        {"inputs_q", &in.q},       {"inputs_k", &in.k},           {"inputs_v", &in.v},
        {"inputs_g", &in.g},       {"inputs_b", &in.b},           {"inputs_w", &in.w},
        {"inputs_beta", &in.beta}, {"inputs_lambda", &in.lambda}, {"inputs_r", &in.r},
        {"inputs_h0", &in.h0}};
    if (c.cotangents) {
      arrays["cotangents_do"] = &c.cotangents->do_;
      if (!c.cotangents->dht.empty()) arrays["cotangents_dht"] = &c.cotangents->dht;
    }
    for (auto [group, sets] : {std::pair{"outputs", &c.outputs}, std::pair{"grads", &c.grads}})
      for (const auto& [n, d] : *sets) {
        arrays[std::string(group) + "_" + n] = &d.data;
        arrays[std::string(group) + "_" + n + "_lo"] = &d.lo;
        const auto dpos = pc.extra.find("--digits ");
        EXPECT_EQ(d.digits,
                  dpos == std::string::npos ? 30.0 : std::atof(pc.extra.c_str() + dpos + 9))
            << n;
      }
    size_t compared = 0;
    for (const auto& e : fs::directory_iterator(raw)) {
      const std::string stem = e.path().stem().string();
      if (stem == "root_scale") continue;
      ++compared;
      if (stem == "inputs_cu_seqlens") {
        EXPECT_EQ(read_raw<int64_t>(e.path()), in.cu_seqlens);
        continue;
      }
      ASSERT_TRUE(arrays.count(stem)) << stem << " written by h5py but not read";
      EXPECT_FALSE(arrays[stem]->empty()) << stem;
      EXPECT_TRUE(same_bits(read_raw<double>(e.path()), *arrays[stem])) << stem;
    }
    size_t nonempty = in.cu_seqlens.empty() ? 0 : 1;
    for (const auto& [n, x] : arrays) nonempty += x->empty() ? 0 : 1;
    EXPECT_EQ(compared, nonempty) << "read_case returned arrays h5py did not write";
  }
}

}  // namespace
