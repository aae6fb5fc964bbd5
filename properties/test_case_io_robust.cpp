// Case files under hostile input: memory bounds checked before allocating, the isolated reader
// turning libhdf5 crashes, runaway allocations and loops into qed::Error, and seeded
// damaged-byte sweeps through read_case.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "fixtures/case.hpp"
#include "fixtures/case_patch.hpp"
#include "fixtures/generate.hpp"


// AddressSanitizer builds (gcc defines __SANITIZE_ADDRESS__, clang has __has_feature).
#if defined(__SANITIZE_ADDRESS__)
#define QED_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QED_ASAN 1
#endif
#endif
#ifndef QED_ASAN
#define QED_ASAN 0
#endif
namespace {

using namespace qed::fixtures;
using qed::reference::Arm;
using qed::reference::Variant;
namespace fs = std::filesystem;

// B=2 T=7 H=2 K=3 V=5 (or B=1 with cu_seqlens {0,3,3,7}: N=3), h0, do+dht, outputs, grads.
Case good_case(Variant v, Arm a, bool varlen) {
  GenSpec s;
  s.variant = v;
  s.arm = a;
  s.seed = 42;
  s.dims = {varlen ? 1 : 2, 7, 2, 3, 5};
  if (varlen) s.seqlens = {3, 0, 4};
  s.with_h0 = true;
  Case c;
  c.inputs = generate(s);
  c.cotangents = generate_cotangents(c.inputs, 1, true);
  auto add = [&](std::map<std::string, Dataset>& m, const std::string& n) {
    Dataset d;
    d.shape = input_shape(c.inputs, n);
    size_t count = 1;
    for (auto e : d.shape) count *= static_cast<size_t>(e);
    d.data.assign(count, 0.5);
    d.lo.assign(count, 1e-17);
    d.digits = 20;
    m[n] = d;
  };
  add(c.outputs, "o");
  add(c.outputs, "ht");
  for (const auto& n : grad_names(v, a)) add(c.grads, n);
  return c;
}

class Robust : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("qedcheck-robust-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string good(Variant v = Variant::gdn2, Arm a = Arm::none, bool varlen = false) {
    const std::string path = (dir_ / "c.h5").string();
    write_case(path, good_case(v, a, varlen));
    return path;
  }
  // read_case must throw exactly `path + ": " + rest` and keep stderr silent.
  // Both ways of reading (isolated child process and in-process) must agree.
  void expect_error(const std::string& path, const std::string& rest, ReadOptions o = {}) {
    for (bool isolate : {true, false}) {
      o.isolate = isolate;
      SCOPED_TRACE(isolate ? "isolated" : "in-process");
      expect_error_once(path, rest, o);
    }
  }
  void expect_error_once(const std::string& path, const std::string& rest, const ReadOptions& o) {
    ::testing::internal::CaptureStderr();
    std::string got = "(no error)";
    try {
      read_case(path, o);
    } catch (const qed::Error& e) {
      got = e.what();
    }
    EXPECT_EQ(::testing::internal::GetCapturedStderr(), "") << "HDF5 printed on stderr";
    EXPECT_EQ(got, path + ": " + rest);
  }
  fs::path dir_;
};

// ---------------------------------------------------------------- memory
// Replaces `name` by a chunked dataset of `dims` with nothing written: any size, no disk space.
void huge(CasePatch& patch, const std::string& name, const std::vector<hsize_t>& dims) {
  patch.remove(name);
  std::vector<hsize_t> chunk(dims.size(), 1);
  h5::Id space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  h5::Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data());
  h5::Id ds(H5Dcreate2(patch.file(), name.c_str(), H5T_IEEE_F64LE, space.get(), H5P_DEFAULT,
                       dcpl.get(), H5P_DEFAULT),
            H5Dclose);
  if (!ds.valid()) throw qed::Error("cannot create " + name);
}

// deltanet with B=2^15, T=2^15, H=2^13: q and k are 2^45 * 8 bytes = 256 TiB each.
std::string huge_case(const std::string& path) {
  CasePatch patch(path);
  const hsize_t B = hsize_t{1} << 15, T = hsize_t{1} << 15, H = hsize_t{1} << 13;
  huge(patch, "/inputs/q", {B, T, H, 4});
  huge(patch, "/inputs/k", {B, T, H, 4});
  huge(patch, "/inputs/v", {B, T, H, 1});
  huge(patch, "/inputs/beta", {B, T, H});
  patch.remove("/inputs/h0").remove("/cotangents").remove("/outputs").remove("/grads");
  return path;
}

TEST_F(Robust, DeclaredSizeBeyondMemoryIsRejectedBeforeAllocating) {
  const std::string p = huge_case(good(Variant::deltanet));
  ReadOptions o;
  o.max_bytes = uint64_t{1} << 30;
  expect_error(p,
               "/inputs/q: shape [32768,32768,8192,4] needs 281474976710656 bytes, more than the "
               "1073741824 bytes left (rule: a case must fit in memory)",
               o);
  try {  // default bound: this machine's physical memory
    read_case(p);
    FAIL() << "read a 256 TiB case";
  } catch (const qed::Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind(p + ": /inputs/q: shape [32768,32768,8192,4] needs 281474976710656 bytes, "
                          "more than the ",
                      0),
              0u)
        << m;
  }
}
TEST_F(Robust, MemoryBoundIsChargedPerDataset) {
  const std::string p = good();
  ReadOptions o;
  o.max_bytes = 2 * 7 * 2 * 3 * 8 * 2 + 1;  // room for q and k only
  expect_error(p,
               "/inputs/v: shape [2,7,2,5] needs 1120 bytes, more than the 1 bytes left (rule: a "
               "case must fit in memory)",
               o);
  o.max_bytes = 0;
  EXPECT_NO_THROW(read_case(p, o));
}
TEST_F(Robust, DimensionsWhoseProductOverflows) {
  const std::string p = good(Variant::deltanet);
  {
    CasePatch patch(p);
    const hsize_t M = hsize_t{1} << 20;
    huge(patch, "/inputs/q", {M, M, M, 8});
    huge(patch, "/inputs/k", {M, M, M, 8});
    huge(patch, "/inputs/v", {M, M, M, 8});
    huge(patch, "/inputs/beta", {M, M, M});
    patch.remove("/inputs/h0").remove("/cotangents").remove("/outputs").remove("/grads");
  }
  expect_error(p,
               "/inputs/q: shape [1048576,1048576,1048576,8] overflows 64-bit sizes (rule: a case "
               "must fit in memory)");
}

// ---------------------------------------------------------------- isolation from libhdf5 bugs
// Damages the variable-length string descriptor of the root attribute `format` (13 bytes, the
// first object of the first global heap collection, "GCOL"): `field` 0 is its length, 1 its
// heap index. libhdf5 1.10 trusts both.
std::string damage_format_descriptor(const std::string& path, int field, uint32_t value) {
  std::ifstream in(path, std::ios::binary);
  std::string b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t heap = b.find("GCOL");
  EXPECT_NE(heap, std::string::npos);
  std::string pattern(12, '\0');
  const uint32_t len = 13;
  const uint64_t addr = heap;
  std::memcpy(pattern.data(), &len, 4);
  std::memcpy(pattern.data() + 4, &addr, 8);
  const size_t at = b.find(pattern);
  EXPECT_NE(at, std::string::npos);
  EXPECT_EQ(b.find(pattern, at + 1), std::string::npos);
  std::memcpy(b.data() + at + (field == 0 ? 0 : 12), &value, 4);
  const std::string out = path + ".damaged.h5";
  std::ofstream(out, std::ios::binary | std::ios::trunc) << b;
  return out;
}

TEST_F(Robust, IsolationTurnsALibraryCrashIntoAnError) {
  const std::string p = damage_format_descriptor(good(), 1, 0xFFFFF);
  ::testing::internal::CaptureStderr();
  std::string got;
  try {
    read_case(p);
  } catch (const qed::Error& e) {
    got = e.what();
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
#if !QED_ASAN  // AddressSanitizer reports the child's crash on stderr
  EXPECT_EQ(err, "");
#endif
  // libhdf5 1.10.8 indexes past its heap table here (SIGSEGV); a fixed libhdf5 reports an error.
  const std::string crash = p + ": the HDF5 library crashed reading this file (";
  const std::string clean = p + ": /@format: unreadable string (HDF5: ";
  EXPECT_TRUE(got.rfind(crash, 0) == 0 || got.rfind(clean, 0) == 0) << got;
}
TEST_F(Robust, IsolationCapsLibraryAllocations) {
  // A 2 GiB string length: libhdf5 allocates and zeroes it before noticing anything; the
  // reader's address-space cap makes that allocation fail quickly instead.
#if QED_ASAN
  GTEST_SKIP() << "AddressSanitizer's shadow memory rules out the address-space cap";
#endif
  const std::string p = damage_format_descriptor(good(), 0, 0x7FFFFFFF);
  ::testing::internal::CaptureStderr();
  std::string got;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    read_case(p);
  } catch (const qed::Error& e) {
    got = e.what();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(got.rfind(p + ": /@format: unreadable string (HDF5: ", 0), 0u) << got;
  EXPECT_LT(seconds, 5.0);
}
TEST_F(Robust, IsolationTimeLimit) {
  const std::string p = good();
  ReadOptions o;
  o.timeout_s = 1e-6;
  try {
    read_case(p, o);
    FAIL() << "no timeout";
  } catch (const qed::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              p + ": reading took longer than 1e-06 s and was stopped (rule: a case is a valid "
                  "HDF5 file (damaged files can send libhdf5 into a loop))");
  }
  o.timeout_s = 0;
  EXPECT_NO_THROW(read_case(p, o));
}

// ---------------------------------------------------------------- robustness on damaged bytes
// Flips random bytes of a good case and truncates it at random points: read_case must return
// or throw qed::Error, never crash, hang or print. Replay: QEDCHECK_SEED=<seed>; more trials:
// QEDCHECK_DAMAGE_TRIALS=<n> (the `slow` sweep in properties/fixtures.cmake runs 5000 per seed).
TEST_F(Robust, DamagedBytesNeverCrash) {
  const uint64_t seed = std::getenv("QEDCHECK_SEED")
                            ? std::strtoull(std::getenv("QEDCHECK_SEED"), nullptr, 10)
                            : 20240611;
  SCOPED_TRACE("replay: QEDCHECK_SEED=" + std::to_string(seed) +
               " ./test_case_io_robust --gtest_filter=*DamagedBytes*");
  const std::string p = good(Variant::qed, Arm::rand, true);
  std::ifstream in(p, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Rng rng(seed);
  const std::string bad = (dir_ / "bad.h5").string();
  int accepted = 0, rejected = 0, crashed = 0, stopped = 0;
  ::testing::internal::CaptureStderr();
  const int trials = std::getenv("QEDCHECK_DAMAGE_TRIALS")
                         ? std::atoi(std::getenv("QEDCHECK_DAMAGE_TRIALS"))
                         : 200;
  for (int trial = 0; trial < trials; ++trial) {
    std::string b = bytes;
    if (trial % 4 == 3) {
      b.resize(static_cast<size_t>(rng.below(static_cast<int64_t>(b.size()))));
    } else {
      const int flips = 1 + static_cast<int>(rng.below(8));
      for (int i = 0; i < flips; ++i)
        b[static_cast<size_t>(rng.below(static_cast<int64_t>(b.size())))] ^=
            static_cast<char>(1 + rng.below(255));
    }
    std::ofstream(bad, std::ios::binary | std::ios::trunc) << b;
    ReadOptions o;
    o.max_bytes = 1 << 24;
    o.timeout_s = 2;
    try {
      read_case(bad, o);
      ++accepted;
    } catch (const qed::Error& e) {
      const std::string m = e.what();
      ++rejected;
      crashed += m.find("library crashed") != std::string::npos;
      stopped += m.find("was stopped") != std::string::npos;
      EXPECT_EQ(m.rfind(bad + ": ", 0), 0u) << "trial " << trial << ": " << m;
    }
  }
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_GT(rejected, 50);
  std::printf("damaged files: %d accepted, %d rejected (%d libhdf5 crashes, %d timeouts)\n",
              accepted, rejected, crashed, stopped);
}

}  // namespace
