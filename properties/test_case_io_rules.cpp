// Case-file validation: one test per rule of CASE_FORMAT.md. Each writes a good case, breaks
// exactly one thing with CasePatch (HDF5 C API), and checks the whole message (file, dataset,
// index, rule) and that HDF5 printed nothing on stderr.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "fixtures/case.hpp"
#include "fixtures/case_patch.hpp"
#include "fixtures/generate.hpp"

namespace {

using namespace qed::fixtures;
using qed::reference::Arm;
using qed::reference::Variant;
namespace fs = std::filesystem;

class Rules : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("qedcheck-rules-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // B=2 T=7 H=2 K=3 V=5 (or B=1 with cu_seqlens {0,3,3,7}: N=3), h0, do+dht, outputs, grads.
  std::string good(Variant v = Variant::gdn2, Arm a = Arm::none, bool varlen = false,
                   const std::string& name = "c.h5") {
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
    for (const auto& n : {std::string("o"), std::string("ht")}) add(c, c.outputs, n);
    for (const auto& n : grad_names(v, a)) add(c, c.grads, n);
    const std::string path = (dir_ / name).string();
    write_case(path, c);
    return path;
  }

  static void add(const Case& c, std::map<std::string, Dataset>& m, const std::string& n) {
    Dataset d;
    d.shape = input_shape(c.inputs, n);
    size_t count = 1;
    for (auto e : d.shape) count *= static_cast<size_t>(e);
    d.data.assign(count, 0.5);
    d.lo.assign(count, 1e-17);
    d.digits = 20;
    m[n] = d;
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
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(got, path + ": " + rest);
    EXPECT_EQ(err, "") << "HDF5 printed on stderr";
  }
  // Like expect_error, for messages carrying HDF5's own words: prefix and suffix must match.
  void expect_error_around(const std::string& path, const std::string& head,
                           const std::string& tail) {
    ::testing::internal::CaptureStderr();
    std::string got = "(no error)";
    try {
      read_case(path);
    } catch (const qed::Error& e) {
      got = e.what();
    }
    EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
    EXPECT_EQ(got.rfind(path + ": " + head, 0), 0u) << got;
    EXPECT_TRUE(got.size() >= tail.size() &&
                got.compare(got.size() - tail.size(), tail.size(), tail) == 0)
        << got;
  }
  std::string file(const std::string& n) const { return (dir_ / n).string(); }

  fs::path dir_;
};

const std::vector<double> kZeros(2 * 7 * 2 * 5, 0.0);

// ---------------------------------------------------------------- the file itself
TEST_F(Rules, MissingFile) {
  expect_error(
      file("nope.h5"),
      "cannot open: No such file or directory (rule: the case file must exist and be readable)");
}
TEST_F(Rules, Directory) {
  expect_error(dir_.string(), "is a directory (rule: a case is an HDF5 file)");
}
TEST_F(Rules, NotARegularFile) {
  const std::string fifo = file("pipe.h5");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error(fifo, "is not a regular file (rule: a case is an HDF5 file)");
}
TEST_F(Rules, NotHdf5) {
  std::ofstream(file("t.h5")) << "q,k,v\n1,2,3\n";
  expect_error(file("t.h5"), "not an HDF5 file (rule: a case is an HDF5 file)");
  std::ofstream(file("empty.h5")).close();
  expect_error(file("empty.h5"), "not an HDF5 file (rule: a case is an HDF5 file)");
}
TEST_F(Rules, Truncated) {
  const std::string p = good();
  fs::resize_file(p, fs::file_size(p) / 2);
  expect_error_around(p, "cannot be opened as HDF5, truncated or damaged (HDF5: ",
                      ") (rule: a case is a complete HDF5 file)");
}

// ---------------------------------------------------------------- root attributes
TEST_F(Rules, FormatMissing) {
  const std::string p = good();
  CasePatch(p).attr_remove("/", "format");
  expect_error(p, "/@format: missing (rule: root attribute format = \"qedcheck.case\")");
}
TEST_F(Rules, FormatWrong) {
  const std::string p = good();
  CasePatch(p).attr_string("/", "format", "qedcheck.kase");
  expect_error(p, "/@format: 'qedcheck.kase' (rule: root attribute format = \"qedcheck.case\")");
}
TEST_F(Rules, FormatNotAString) {
  const std::string p = good();
  CasePatch(p).attr_number("/", "format", H5T_STD_I32LE, {1});
  expect_error(p, "/@format: has HDF5 type class integer (rule: this attribute is a string)");
}
TEST_F(Rules, VersionUnsupported) {
  const std::string p = good();
  CasePatch(p).attr_number("/", "version", H5T_STD_I64LE, {2});
  expect_error(p, "/@version: 2 is not supported (rule: root attribute version = 1)");
}
TEST_F(Rules, VersionMissing) {
  const std::string p = good();
  CasePatch(p).attr_remove("/", "version");
  expect_error(p, "/@version: missing (rule: root attribute version = 1)");
}
TEST_F(Rules, VersionNotAnInteger) {
  const std::string p = good();
  CasePatch(p).attr_number("/", "version", H5T_IEEE_F64LE, {1});
  expect_error(p, "/@version: has HDF5 type class float (rule: this attribute is an integer)");
}
TEST_F(Rules, VersionAnyIntegerTypeAndScaleAnyFloatAndFixedStringsAreAccepted) {
  const std::string p = good(Variant::qed, Arm::full);
  CasePatch(p)
      .attr_number("/", "version", H5T_STD_U8BE, {1})
      .attr_number("/", "scale", H5T_IEEE_F32BE, {0.5})
      .attr_string("/", "variant", "qed", true)
      .attr_string("/", "arm", "full", true)
      .attr_string("/inputs", "dtype", "bfloat16", true);
  const Case c = read_case(p);
  EXPECT_EQ(c.inputs.scale, 0.5);
  EXPECT_EQ(c.inputs.arm, Arm::full);
  EXPECT_EQ(c.dtype, "bfloat16");
}
TEST_F(Rules, AttributeWithSeveralValues) {
  const std::string p = good();
  CasePatch(p).attr_number("/", "version", H5T_STD_I64LE, {1, 1});
  expect_error(p, "/@version: holds 2 values (rule: attributes are single values)");
}
TEST_F(Rules, VariantUnknown) {
  const std::string p = good();
  CasePatch(p).attr_string("/", "variant", "gdn3");
  expect_error(p, "/@variant: 'gdn3' (rule: variant is gdn2, qed, kda, gdn or deltanet)");
}
TEST_F(Rules, VariantMissing) {
  const std::string p = good();
  CasePatch(p).attr_remove("/", "variant");
  expect_error(p, "/@variant: missing (rule: variant is gdn2, qed, kda, gdn or deltanet)");
}
TEST_F(Rules, ArmMissingForQed) {
  const std::string p = good(Variant::qed, Arm::nogate);
  CasePatch(p).attr_remove("/", "arm");
  expect_error(p, "/@arm: missing (rule: arm is required for variant qed)");
}
TEST_F(Rules, ArmGivenForOtherVariant) {
  const std::string p = good(Variant::kda);
  CasePatch(p).attr_string("/", "arm", "full");
  expect_error(p, "/@arm: 'full' given for variant kda (rule: arm only with variant qed)");
}
TEST_F(Rules, ArmUnknown) {
  const std::string p = good(Variant::qed, Arm::full);
  CasePatch(p).attr_string("/", "arm", "half");
  expect_error(p, "/@arm: 'half' (rule: arm is full, nogate, nogate_noproj or rand)");
}
TEST_F(Rules, ScaleMissing) {
  const std::string p = good();
  CasePatch(p).attr_remove("/", "scale");
  expect_error(p, "/@scale: missing (rule: root attribute scale (float64))");
}
TEST_F(Rules, ScaleNotFinite) {
  const std::string p = good();
  CasePatch(p).attr_number("/", "scale", H5T_IEEE_F64LE, {INFINITY});
  expect_error(p, "/@scale: value inf is not finite (rule: scale is finite)");
}
TEST_F(Rules, ScaleNotAFloat) {
  const std::string p = good();
  CasePatch(p).attr_number("/", "scale", H5T_STD_I64LE, {1});
  expect_error(p, "/@scale: has HDF5 type class integer (rule: this attribute is a float64)");
}
TEST_F(Rules, ProducerNotAString) {
  const std::string p = good();
  CasePatch(p).attr_number("/", "producer", H5T_IEEE_F64LE, {1});
  expect_error(p, "/@producer: has HDF5 type class float (rule: this attribute is a string)");
}

// ---------------------------------------------------------------- /inputs structure
TEST_F(Rules, InputsMissing) {
  const std::string p = good();
  CasePatch(p).remove("/inputs");
  expect_error(p, "/inputs: missing (rule: every case has /inputs)");
}
TEST_F(Rules, InputsNotAGroup) {
  const std::string p = good();
  CasePatch(p).remove("/inputs").doubles("/inputs", {1}, {0.0});
  expect_error(p, "/inputs: is a dataset (rule: /inputs is a group stored in the file)");
}
TEST_F(Rules, DtypeMissing) {
  const std::string p = good();
  CasePatch(p).attr_remove("/inputs", "dtype");
  expect_error(p, "/inputs@dtype: missing (rule: dtype is float64, float32, float16 or bfloat16)");
}
TEST_F(Rules, DtypeUnknown) {
  const std::string p = good();
  CasePatch(p).attr_string("/inputs", "dtype", "float8");
  expect_error(p, "/inputs@dtype: 'float8' (rule: dtype is float64, float32, float16 or bfloat16)");
}
TEST_F(Rules, RequiredDatasetMissing) {
  const std::string p = good();
  CasePatch(p).remove("/inputs/w");
  expect_error(p, "/inputs/w: missing (rule: variant gdn2 requires q, k, v, g, b, w)");
  const std::string r = good(Variant::qed, Arm::rand, false, "r.h5");
  CasePatch(r).remove("/inputs/r");
  expect_error(r, "/inputs/r: missing (rule: variant qed requires q, k, v, g, b, w, lambda, r)");
}
TEST_F(Rules, DatasetTheVariantDoesNotHave) {
  const std::string p = good(Variant::kda);
  CasePatch(p).doubles("/inputs/b", {2, 7, 2, 3}, std::vector<double>(84, 0.5));
  expect_error(p,
               "/inputs/b: present, but variant kda has no b (rule: variant kda has inputs q, k, "
               "v, g, beta (+ h0, cu_seqlens))");
  const std::string q = good(Variant::qed, Arm::full, false, "q.h5");
  CasePatch(q).doubles("/inputs/r", {2, 3}, std::vector<double>(6, 0.5));
  expect_error(q,
               "/inputs/r: present, but variant qed has no r (rule: variant qed has inputs q, k, "
               "v, g, b, w, lambda (+ h0, cu_seqlens))");
}
TEST_F(Rules, UnknownDataset) {
  const std::string p = good(Variant::qed, Arm::full);
  CasePatch(p).doubles("/inputs/lamda", {2}, {0.5, 0.5});
  expect_error(p,
               "/inputs/lamda: unknown dataset (rule: variant qed has inputs q, k, v, g, b, w, "
               "lambda (+ h0, cu_seqlens))");
  ReadOptions o;
  o.allow_unknown_datasets = true;
  EXPECT_NO_THROW(read_case(p, o));
}
TEST_F(Rules, LinksAndGroupsInsteadOfDatasets) {
  const std::string p = good();
  CasePatch(p).soft_link("/inputs/h0", "/outputs/ht");
  expect_error(p, "/inputs/h0: is a soft link (rule: case data are datasets stored in the file)");
  CasePatch(p).external_link("/inputs/h0", file("other.h5"), "/outputs/ht");
  expect_error(p,
               "/inputs/h0: is an external or user-defined link (rule: case data are datasets "
               "stored in the file)");
  CasePatch(p).group("/inputs/h0");
  expect_error(p, "/inputs/h0: is a group (rule: case data are datasets stored in the file)");
}
TEST_F(Rules, WrongTypeClass) {
  const std::string p = good();
  CasePatch(p).ints("/inputs/q", {2, 7, 2, 3}, std::vector<int64_t>(84, 0));
  expect_error(
      p, "/inputs/q: has HDF5 type class integer (rule: floating-point datasets are float64)");
}
TEST_F(Rules, WrongFloatSize) {
  const std::string p = good();
  CasePatch(p).doubles("/inputs/k", {2, 7, 2, 3}, std::vector<double>(84, 0.5), H5T_IEEE_F32LE);
  expect_error(
      p, "/inputs/k: stored as a 32-bit float (rule: floating-point datasets are IEEE float64)");
}
TEST_F(Rules, BigEndianFloat64IsAccepted) {
  const std::string p = good();
  std::vector<double> k(84);
  for (size_t i = 0; i < k.size(); ++i) k[i] = 0.1 * static_cast<double>(i);
  CasePatch(p).doubles("/inputs/k", {2, 7, 2, 3}, k, H5T_IEEE_F64BE);
  EXPECT_EQ(read_case(p).inputs.k, k);
}
TEST_F(Rules, WrongRank) {
  const std::string p = good();
  CasePatch(p).doubles("/inputs/q", {2, 7, 6}, std::vector<double>(84, 0.5));
  expect_error(p, "/inputs/q: rank 3 [2,7,6], expected rank 4 [B,T,H,K] (rule: q is [B,T,H,K])");
  const std::string g = good(Variant::gdn, Arm::none, false, "g.h5");
  CasePatch(g).doubles("/inputs/g", {2, 7, 2, 3}, std::vector<double>(84, -0.5));
  expect_error(g, "/inputs/g: rank 4 [2,7,2,3], expected rank 3 [B,T,H] (rule: g is [B,T,H])");
}
TEST_F(Rules, AbsurdRank) {
  const std::string p = good();
  CasePatch(p).doubles("/inputs/v", {2, 7, 2, 5, 1}, kZeros);
  expect_error(p, "/inputs/v: rank 5 (rule: datasets have rank <= 4)");
}
TEST_F(Rules, ZeroDimension) {
  const std::string p = good();
  CasePatch(p).doubles("/inputs/q", {2, 7, 2, 0}, {});
  expect_error(p, "/inputs/q: K = 0 (rule: dimensions B, T, H, K, V >= 1)");
  CasePatch(p).doubles("/inputs/q", {2, 0, 2, 3}, {});
  expect_error(p, "/inputs/q: T = 0 (rule: dimensions B, T, H, K, V >= 1)");
  const std::string v = good(Variant::gdn2, Arm::none, false, "v.h5");
  CasePatch(v).doubles("/inputs/v", {2, 7, 2, 0}, {});
  expect_error(v, "/inputs/v: V = 0 (rule: dimensions B, T, H, K, V >= 1)");
}
TEST_F(Rules, ShapeMismatch) {
  const std::string p = good();
  CasePatch(p).doubles("/inputs/v", {2, 7, 3, 5}, std::vector<double>(210, 0.5));
  expect_error(p,
               "/inputs/v: shape [2,7,3,5], expected [2,7,2,5] = [B,T,H,V] (rule: v is [B,T,H,V], "
               "with B, T, H from q)");
  const std::string g = good(Variant::gdn2, Arm::none, false, "g.h5");
  CasePatch(g).doubles("/inputs/g", {2, 7, 2, 4}, std::vector<double>(112, -0.5));
  expect_error(g,
               "/inputs/g: shape [2,7,2,4], expected [2,7,2,3] = [B,T,H,K] (rule: g is [B,T,H,K], "
               "with B, T, H, K from q, V from v, N from cu_seqlens)");
  const std::string l = good(Variant::qed, Arm::full, false, "l.h5");
  CasePatch(l).doubles("/inputs/lambda", {3}, {0.5, 0.5, 0.5});
  expect_error(l,
               "/inputs/lambda: shape [3], expected [2] = [H] (rule: lambda is [H], with B, T, H, "
               "K from q, V from v, N from cu_seqlens)");
}
TEST_F(Rules, InitialStateFirstDimensionIsN) {
  const std::string p = good(Variant::gdn2, Arm::none, true);
  CasePatch(p).doubles("/inputs/h0", {1, 2, 3, 5}, std::vector<double>(30, 0.0));
  expect_error(p,
               "/inputs/h0: shape [1,2,3,5], expected [3,2,3,5] = [N,H,K,V] (rule: h0 is "
               "[N,H,K,V], with B, T, H, K from q, V from v, N from cu_seqlens)");
}

// ---------------------------------------------------------------- /inputs values
TEST_F(Rules, NonFiniteInput) {
  const std::string p = good();
  CasePatch(p).set("/inputs/q", 2 * 7 * 2 * 3 - 1, NAN);
  expect_error(p, "/inputs/q[1,6,1,2]: value nan is not finite (rule: inputs are finite)");
  CasePatch(p).set("/inputs/q", 2 * 7 * 2 * 3 - 1, 0.0).set("/inputs/h0", 5, -INFINITY);
  expect_error(p, "/inputs/h0[0,0,1,0]: value -inf is not finite (rule: inputs are finite)");
  ReadOptions o;
  o.check_values = false;
  EXPECT_TRUE(std::isinf(read_case(p, o).inputs.h0[5]));
}
TEST_F(Rules, LogDecayPositive) {
  const std::string p = good();
  CasePatch(p).set("/inputs/g", ((0 * 7 + 3) * 2 + 1) * 3 + 2, 0.25).set("/inputs/g", 80, 0.5);
  expect_error(p, "/inputs/g[0,3,1,2]: value 0.25 is positive (rule: log-decay g <= 0)");
  CasePatch(p).set("/inputs/g", ((0 * 7 + 3) * 2 + 1) * 3 + 2, NAN);
  expect_error(p, "/inputs/g[0,3,1,2]: value nan is not finite (rule: inputs are finite)");
}
TEST_F(Rules, GatesOutsideUnitInterval) {
  const std::string p = good();
  CasePatch(p).set("/inputs/b", 4, 1.5);
  expect_error(p, "/inputs/b[0,0,1,1]: value 1.5 is outside [0, 1] (rule: gate b in [0, 1])");
  CasePatch(p).set("/inputs/b", 4, 1.0).set("/inputs/w", 0, -1e-300);
  expect_error(p, "/inputs/w[0,0,0,0]: value -1e-300 is outside [0, 1] (rule: gate w in [0, 1])");
  const std::string d = good(Variant::deltanet, Arm::none, false, "d.h5");
  CasePatch(d).set("/inputs/beta", 27, 2);
  expect_error(d, "/inputs/beta[1,6,1]: value 2 is outside [0, 1] (rule: gate beta in [0, 1])");
}
TEST_F(Rules, LambdaNegativeOrInfinite) {
  const std::string p = good(Variant::qed, Arm::nogate_noproj);
  CasePatch(p).set("/inputs/lambda", 1, -0.125);
  expect_error(p, "/inputs/lambda[1]: value -0.125 is negative (rule: lambda >= 0)");
  CasePatch(p).set("/inputs/lambda", 1, INFINITY);
  expect_error(p, "/inputs/lambda[1]: value inf is not finite (rule: inputs are finite)");
}
TEST_F(Rules, DirectionNotFinite) {
  const std::string p = good(Variant::qed, Arm::rand);
  CasePatch(p).set("/inputs/r", 4, NAN);
  expect_error(p, "/inputs/r[1,1]: value nan is not finite (rule: inputs are finite)");
}

// ---------------------------------------------------------------- cu_seqlens
TEST_F(Rules, CuSeqlensNotInteger) {
  const std::string p = good(Variant::gdn, Arm::none, true);
  CasePatch(p).doubles("/inputs/cu_seqlens", {4}, {0, 3, 3, 7});
  expect_error(p,
               "/inputs/cu_seqlens: has HDF5 type class float (rule: cu_seqlens is an integer "
               "dataset (int64))");
}
TEST_F(Rules, CuSeqlensAnyIntegerTypeIsAccepted) {
  const std::string p = good(Variant::gdn, Arm::none, true);
  CasePatch(p).ints("/inputs/cu_seqlens", {4}, {0, 3, 3, 7}, H5T_STD_U8BE);
  EXPECT_EQ(read_case(p).inputs.cu_seqlens, (std::vector<int64_t>{0, 3, 3, 7}));
}
TEST_F(Rules, CuSeqlensRank) {
  const std::string p = good(Variant::gdn, Arm::none, true);
  CasePatch(p).ints("/inputs/cu_seqlens", {2, 2}, {0, 3, 3, 7});
  expect_error(
      p, "/inputs/cu_seqlens: rank 2 [2,2], expected rank 1 [N+1] (rule: cu_seqlens is [N+1])");
}
TEST_F(Rules, CuSeqlensTooShort) {
  const std::string p = good(Variant::gdn, Arm::none, true);
  CasePatch(p).ints("/inputs/cu_seqlens", {1}, {0});
  expect_error(p, "/inputs/cu_seqlens: 1 entries (rule: cu_seqlens is [N+1] with N >= 1)");
}
TEST_F(Rules, CuSeqlensNeedsBatchOne) {
  const std::string p = good();
  CasePatch(p).ints("/inputs/cu_seqlens", {3}, {0, 3, 7});
  expect_error(p, "/inputs/cu_seqlens: given with B = 2 (rule: B = 1 with cu_seqlens)");
}
TEST_F(Rules, CuSeqlensStartsAtZero) {
  const std::string p = good(Variant::gdn, Arm::none, true);
  CasePatch(p).ints("/inputs/cu_seqlens", {4}, {1, 3, 3, 7});
  expect_error(p, "/inputs/cu_seqlens[0]: value 1 (rule: cu_seqlens starts at 0)");
}
TEST_F(Rules, CuSeqlensNonDecreasing) {
  const std::string p = good(Variant::gdn, Arm::none, true);
  CasePatch(p).ints("/inputs/cu_seqlens", {4}, {0, 3, 2, 7});
  expect_error(p, "/inputs/cu_seqlens[2]: value 2 < previous 3 (rule: cu_seqlens non-decreasing)");
}
TEST_F(Rules, CuSeqlensEndsAtT) {
  const std::string p = good(Variant::gdn, Arm::none, true);
  CasePatch(p).ints("/inputs/cu_seqlens", {4}, {0, 3, 3, 6});
  expect_error(p, "/inputs/cu_seqlens[3]: value 6, T = 7 (rule: cu_seqlens ends at T)");
  CasePatch(p).ints("/inputs/cu_seqlens", {4}, {0, 3, 3, INT64_MAX});
  expect_error(
      p, "/inputs/cu_seqlens[3]: value 9223372036854775807, T = 7 (rule: cu_seqlens ends at T)");
}

}  // namespace
