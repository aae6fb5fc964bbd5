// The robustness table (reports/robustness.md) checked row by row: every bad input listed there
// is built in a scratch folder, the command of the row is run with the real qedcheck binary, and
// the exit code and the EXACT stderr must match the table. The table is parsed from the markdown,
// so the table and the test cannot drift. QEDCHECK_ROBUSTNESS_PRINT=1 prints the rows as they
// are now (what the table should say), for updating it after a deliberate change of a message.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

#include "fixtures/case.hpp"
#include "fixtures/case_patch.hpp"
#include "fixtures/generate.hpp"
#include "verify/implementations.hpp"
#ifdef QEDCHECK_HAVE_CUDA
#include "kernels/api.hpp"
#endif

using namespace qed;
namespace fs = std::filesystem;

namespace {

const std::string kTable = std::string(QEDCHECK_SOURCE_DIR) + "/reports/robustness.md";

struct Row {
  std::string id, input, command, message;
  std::string status;  // the exit column as written (kernel rows: a StatusCode name)
  int exit = -1;
};

std::vector<std::string> split_cells(const std::string& line) {
  std::vector<std::string> cells;
  std::string cur;
  for (size_t i = 1; i < line.size(); ++i) {  // skip the leading '|'
    if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == '|') {
      cur += '|';
      ++i;
    } else if (line[i] == '|') {
      cells.push_back(cur);
      cur.clear();
    } else {
      cur += line[i];
    }
  }
  for (auto& c : cells) {
    const size_t a = c.find_first_not_of(' '), b = c.find_last_not_of(' ');
    c = a == std::string::npos ? "" : c.substr(a, b - a + 1);
  }
  return cells;
}

std::string unquote(std::string s) {  // `x` or `` x ``
  if (s.rfind("`` ", 0) == 0 && s.size() >= 6) return s.substr(3, s.size() - 6);
  if (s.size() >= 2 && s.front() == '`' && s.back() == '`') return s.substr(1, s.size() - 2);
  return s;
}

// Rows of the table that follows `heading` (columns: id | bad input | command | exit | message).
std::vector<Row> read_table(const std::string& heading, const std::string& file = kTable) {
  std::ifstream f(file);
  std::vector<Row> rows;
  std::string line;
  bool in_section = false;
  while (std::getline(f, line)) {
    if (line.rfind("## ", 0) == 0) in_section = line.find(heading) != std::string::npos;
    if (!in_section || line.rfind("| ", 0) != 0) continue;
    const auto cells = split_cells(line);
    if (cells.size() != 5 || cells[0] == "id" || cells[0].rfind("---", 0) == 0) continue;
    Row r;
    r.id = cells[0];
    r.input = cells[1];
    r.command = unquote(cells[2]);
    r.exit = std::atoi(cells[3].c_str());
    r.status = cells[3];
    r.message = cells[4] == "(none)" ? "" : unquote(cells[4]);
    rows.push_back(r);
  }
  return rows;
}

// The table's shorthand `qedcheck {reference,run,verify} F` stands for these three commands.
std::vector<std::string> expand(const std::string& command) {
  const std::string all = "qedcheck {reference,run,verify} ";
  if (command.rfind(all, 0) != 0) return {command};
  const std::string f = command.substr(all.size());
  return {"qedcheck reference " + f + " -o out.h5", "qedcheck run " + f + " -o out.h5",
          "qedcheck verify " + f + " --no-golden"};
}

// Exact comparison, except that "<*>" in the table matches any text on the line (used only
// where the message names something of the machine or the build: memory left, the verb list).
bool matches(const std::string& pattern, const std::string& text) {
  const size_t star = pattern.find("<*>");
  if (star == std::string::npos) return pattern == text;
  const std::string head = pattern.substr(0, star), tail = pattern.substr(star + 3);
  if (text.rfind(head, 0) != 0 || text.size() < head.size()) return false;
  for (size_t i = head.size(); i <= text.size(); ++i)
    if (text.substr(head.size(), i - head.size()).find('\n') == std::string::npos && matches(tail, text.substr(i)))
      return true;
  return false;
}

struct Result {
  int exit = -1;
  std::string err;
};

Result run(const fs::path& dir, const std::string& command) {
  const std::string args = command.substr(std::string("qedcheck").size());
  const std::string sh = "cd '" + dir.string() + "' && " + QEDCHECK_BINARY + args +
                         " > stdout.txt 2> stderr.txt";
  const int st = std::system(sh.c_str());
  Result r;
  r.exit = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  std::ifstream e(dir / "stderr.txt");
  std::stringstream ss;
  ss << e.rdbuf();
  r.err = ss.str();
  while (!r.err.empty() && r.err.back() == '\n') r.err.pop_back();
  return r;
}

// ---- the bad inputs, by file name ----

fixtures::Case good_case(bool varlen = false) {
  fixtures::GenSpec s;
  s.variant = reference::Variant::qed;
  s.arm = reference::Arm::full;
  s.dims = {1, 4, 1, 2, 2};
  s.seed = 1;
  if (varlen) s.seqlens = {1, 3};
  fixtures::Case c;
  c.inputs = fixtures::generate(s);
  return c;
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A float64 dataset of the given shape that holds no data (chunked, never written): the file
// stays small whatever the shape claims.
void huge_dataset(fixtures::CasePatch& p, const std::string& obj, const std::vector<int64_t>& shape) {
  p.remove(obj);
  std::vector<hsize_t> dims(shape.begin(), shape.end()), chunk(shape.size(), 1);
  chunk.back() = static_cast<hsize_t>(shape.back());
  const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
  const hid_t ds = H5Dcreate2(p.file(), obj.c_str(), H5T_IEEE_F64LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  H5Dclose(ds);
  H5Pclose(dcpl);
  H5Sclose(space);
}

using Maker = std::function<void(const fs::path& dir, const std::string& name)>;

std::map<std::string, Maker> makers() {
  auto good = [](const fs::path& d, const std::string& n) { fixtures::write_case((d / n).string(), good_case()); };
  auto patched = [good](std::function<void(fixtures::CasePatch&)> f) {
    return [good, f](const fs::path& d, const std::string& n) {
      good(d, n);
      fixtures::CasePatch p((d / n).string());
      f(p);
    };
  };
  const fixtures::Case g = good_case();
  std::map<std::string, Maker> m;
  m["good.h5"] = good;
  m["not_hdf5.h5"] = [](const fs::path& d, const std::string& n) { write_bytes(d / n, "this is not an HDF5 file\n"); };
  m["empty.h5"] = [](const fs::path& d, const std::string& n) { write_bytes(d / n, ""); };
  m["truncated.h5"] = [good](const fs::path& d, const std::string& n) {
    good(d, "full.h5");
    const std::string bytes = read_bytes(d / "full.h5");
    write_bytes(d / n, bytes.substr(0, bytes.size() / 2));
  };
  m["a_folder.h5"] = [](const fs::path& d, const std::string& n) { fs::create_directories(d / n); };
  m["q_float32.h5"] = patched([g](fixtures::CasePatch& p) { p.doubles("/inputs/q", {1, 4, 1, 2}, g.inputs.q, H5T_IEEE_F32LE); });
  m["q_int32.h5"] = patched([g](fixtures::CasePatch& p) { p.doubles("/inputs/q", {1, 4, 1, 2}, g.inputs.q, H5T_STD_I32LE); });
  m["dtype_float8.h5"] = patched([](fixtures::CasePatch& p) { p.attr_string("/inputs", "dtype", "float8"); });
  m["nan_in_q.h5"] = patched([](fixtures::CasePatch& p) { p.set("/inputs/q", 3, std::nan("")); });
  m["inf_in_v.h5"] = patched([](fixtures::CasePatch& p) { p.set("/inputs/v", 5, std::numeric_limits<double>::infinity()); });
  m["g_positive.h5"] = patched([](fixtures::CasePatch& p) { p.set("/inputs/g", 2, 0.25); });
  m["b_above_one.h5"] = patched([](fixtures::CasePatch& p) { p.set("/inputs/b", 1, 1.5); });
  m["lambda_negative.h5"] = patched([](fixtures::CasePatch& p) { p.set("/inputs/lambda", 0, -0.5); });
  m["cu_decreasing.h5"] = patched([](fixtures::CasePatch& p) { p.ints("/inputs/cu_seqlens", {4}, {0, 3, 2, 4}); });
  m["cu_short.h5"] = patched([](fixtures::CasePatch& p) { p.ints("/inputs/cu_seqlens", {3}, {0, 2, 3}); });
  m["k_is_zero.h5"] = patched([](fixtures::CasePatch& p) {
    for (const char* x : {"/inputs/q", "/inputs/k", "/inputs/g", "/inputs/b"}) p.doubles(x, {1, 4, 1, 0}, {});
  });
  m["t_huge.h5"] = patched([](fixtures::CasePatch& p) {
    const int64_t T = int64_t{1} << 40;
    for (const char* x : {"/inputs/q", "/inputs/k", "/inputs/g", "/inputs/b"}) huge_dataset(p, x, {1, T, 1, 2});
    for (const char* x : {"/inputs/v", "/inputs/w"}) huge_dataset(p, x, {1, T, 1, 2});
  });
  m["k_shape.h5"] = patched([g](fixtures::CasePatch& p) {
    p.doubles("/inputs/k", {1, 3, 1, 2}, std::vector<double>(g.inputs.k.begin(), g.inputs.k.begin() + 6));
  });
  m["no_v.h5"] = patched([](fixtures::CasePatch& p) { p.remove("/inputs/v"); });
  m["variant_mamba.h5"] = patched([](fixtures::CasePatch& p) { p.attr_string("/", "variant", "mamba"); });
  m["typo_lamda.h5"] = patched([](fixtures::CasePatch& p) { p.doubles("/inputs/lamda", {1}, {0.5}); });
  m["h0_two_rows.h5"] = patched([](fixtures::CasePatch& p) { p.doubles("/inputs/h0", {2, 1, 2, 2}, std::vector<double>(8, 0.5)); });
  m["scale_nan.h5"] = patched([](fixtures::CasePatch& p) { p.attr_number("/", "scale", H5T_IEEE_F64LE, {std::nan("")}); });
  m["version_2.h5"] = patched([](fixtures::CasePatch& p) { p.attr_number("/", "version", H5T_STD_I64LE, {2}); });
  m["grads_no_cotangents.h5"] = patched([g](fixtures::CasePatch& p) {
    p.group("/grads");
    p.doubles("/grads/dq", {1, 4, 1, 2}, g.inputs.q);
  });
  m["tolerance_not_json.json"] = [](const fs::path& d, const std::string& n) { write_bytes(d / n, "rtol = 1e-6\n"); };
  m["tolerance_overflow.json"] = [](const fs::path& d, const std::string& n) {
    write_bytes(d / n, R"({"schema": "qedcheck.tolerance/1", "datasets": {"o": {"rtol_frobenius": 1e999}}})");
  };
  m["tolerance_typo.json"] = [](const fs::path& d, const std::string& n) {
    write_bytes(d / n, R"({"schema": "qedcheck.tolerance/1", "datasets": {"o": {"rtol_frobenius": 1e-6, "atol": 1e-5}}})");
  };
  m["unstable_long.h5"] = [](const fs::path& d, const std::string& n) {  // state past float64
    fixtures::GenSpec s;
    s.variant = reference::Variant::qed;
    s.arm = reference::Arm::nogate_noproj;
    s.lambda = 10;
    s.regime = fixtures::Regime::hard;
    s.dims = {1, 600, 1, 4, 4};
    s.seed = 2;
    fixtures::Case c;
    c.inputs = fixtures::generate(s);
    fixtures::write_case((d / n).string(), c);
  };
  m["existing.h5"] = good;  // an output that is already there
  m["nan_in_output.h5"] = [](const fs::path& d, const std::string& n) {
    fixtures::Case c = verify::run_implementation(good_case(), verify::RunOptions{});
    c.outputs["o"].data[1] = std::nan("");
    fixtures::write_case((d / n).string(), c);
  };
  m["output_shape.h5"] = [](const fs::path& d, const std::string& n) {
    fixtures::Case c = verify::run_implementation(good_case(), verify::RunOptions{});
    fixtures::write_case((d / n).string(), c);
    fixtures::CasePatch p((d / n).string());
    p.doubles("/outputs/o", {1, 4, 1, 1}, {0.1, 0.2, 0.3, 0.4});
  };
  return m;
}

// Files a command line names (every word ending in .h5 or .json that is not out.h5 written by it).
void make_inputs(const fs::path& dir, const std::string& command, const std::map<std::string, Maker>& mk) {
  std::istringstream is(command);
  std::string w;
  while (is >> w) {
    if (fs::exists(dir / w) || w == "out.h5") continue;
    auto it = mk.find(w);
    if (it != mk.end()) it->second(dir, w);
  }
}

fs::path scratch(const std::string& id) {
  const fs::path d = fs::temp_directory_path() / ("qedcheck_robust_" + std::to_string(::getpid()) + "_" + id);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST(Robustness, CommandLineTableMatchesTheBinary) {
  const auto rows = read_table("Command line");
  ASSERT_GE(rows.size(), 20u) << "table rows not found in " << kTable;
  const auto mk = makers();
  const bool print = std::getenv("QEDCHECK_ROBUSTNESS_PRINT") != nullptr;
  for (const auto& row : rows) {
    SCOPED_TRACE("row " + row.id + " (" + row.input + "): " + row.command);
    // Permission rows differ for root (which may write anywhere permissions allow) and others.
    if (row.input.find("(root)") != std::string::npos && ::geteuid() != 0) continue;
    if (row.input.find("(non-root)") != std::string::npos && ::geteuid() == 0) continue;
    for (const auto& cmd : expand(row.command)) {
      const fs::path dir = scratch(row.id);
      make_inputs(dir, cmd, mk);
      const Result r = run(dir, cmd);
      if (print) std::printf("| %s | %s | `%s` | %d | `%s` |\n", row.id.c_str(), row.input.c_str(), cmd.c_str(), r.exit, r.err.c_str());
      EXPECT_EQ(r.exit, row.exit) << cmd;
      EXPECT_TRUE(matches(row.message, r.err)) << cmd << "\n  table:  " << row.message << "\n  actual: " << r.err;
      if (row.exit != 0) {
        EXPECT_FALSE(fs::exists(dir / "out.h5")) << "a failed command left its output behind: " << cmd;
      }
      fs::remove_all(dir);
    }
  }
}

// README's "Bad input" table is a selection of the checked table above, copied word for word, so
// that README cannot drift from what the binary says.
TEST(Robustness, ReadmeSelectionIsInTheTable) {
  const auto all = read_table("Command line");
  const auto readme = read_table("Bad input", std::string(QEDCHECK_SOURCE_DIR) + "/README.md");
  ASSERT_GE(readme.size(), 10u) << "README's Bad input table not found";
  for (const auto& r : readme) {
    bool found = false;
    for (const auto& a : all)
      found = found || (a.id == r.id && a.input == r.input && a.command == r.command &&
                        a.status == r.status && a.message == r.message);
    EXPECT_TRUE(found) << "README row '" << r.id << "' is not, word for word, a row of " << kTable;
  }
}

#ifdef QEDCHECK_HAVE_CUDA
namespace {

namespace k = qed::kernels;

const char* code_name(k::StatusCode c) {
  switch (c) {
    case k::StatusCode::ok: return "ok";
    case k::StatusCode::invalid_argument: return "invalid_argument";
    case k::StatusCode::unsupported: return "unsupported";
    case k::StatusCode::no_device: return "no_device";
    case k::StatusCode::cuda_error: return "cuda_error";
  }
  return "?";
}

// The call of a kernel-table row: a valid gdn2 problem (B=1, T=4, H=1, K=V=16, fp32, host
// pointers that validation never dereferences) with the row's one thing broken.
k::Status kernel_row(const std::string& id) {
  alignas(16) static float buf[4096];
  static int64_t cu[8];
  const char* fn = "recurrent_forward";
  k::Problem p;
  p.variant = reference::Variant::gdn2;
  p.B = 1, p.T = 4, p.H = 1, p.K = 16, p.V = 16;
  p.scale = 0.25f;
  auto seq = [&](int64_t D) { return k::seq_tensor(buf, k::DType::fp32, p.T, p.H, D); };
  auto seq_out = [&](int64_t D) { return k::seq_tensor_out(buf, k::DType::fp32, p.T, p.H, D); };
  k::Inputs in;
  auto fill_inputs = [&] {
    const auto lay = reference::layout_of(p.variant, p.arm);
    in = k::Inputs{};
    in.q = seq(p.K), in.k = seq(p.K), in.v = seq(p.V);
    if (lay.channel_g) in.g = seq(p.K);
    if (lay.scalar_g) in.g = seq(1);
    if (lay.has_bw) in.b = seq(p.K), in.w = seq(p.V);
    if (lay.has_beta) in.beta = seq(1);
    if (lay.has_lambda) in.lambda = buf;
    if (lay.has_r) in.r = buf;
  };
  k::GradOutputs gr;
  gr.dq = seq_out(p.K), gr.dk = seq_out(p.K), gr.dv = seq_out(p.V), gr.dg = seq_out(p.K);
  gr.db = seq_out(p.K), gr.dw = seq_out(p.V);
  gr.dh0 = k::state_tensor_out(buf, p.H, p.K, p.V);
  fill_inputs();
  if (id == "k-zero") p.K = 0;
  else if (id == "k-odd") p.K = 15;
  else if (id == "v-6") p.V = 6;
  else if (id == "b-zero") p.B = 0;
  else if (id == "t-negative") p.T = -1;
  else if (id == "scale-nan") p.scale = std::nanf("");
  else if (id == "qed-no-arm") p.variant = reference::Variant::qed;
  else if (id == "gdn2-with-arm") p.arm = reference::Arm::full;
  else if (id == "cu-b2") p.B = 2, p.cu_seqlens = cu, p.num_seqs = 1;
  else if (id == "cu-no-seqs") p.cu_seqlens = cu, p.num_seqs = 0;
  else if (id == "cu-decreasing") {
    const int64_t c[] = {0, 3, 2, 4};
    std::copy(std::begin(c), std::end(c), cu);
    p.cu_seqlens = p.cu_seqlens_host = cu, p.num_seqs = 3;
  } else if (id == "cu-end") {
    const int64_t c[] = {0, 2, 3};
    std::copy(std::begin(c), std::end(c), cu);
    p.cu_seqlens = p.cu_seqlens_host = cu, p.num_seqs = 2;
  }
  if (id.rfind("cu-", 0) == 0 || id == "k-zero" || id == "k-odd" || id == "v-6" || id == "b-zero" ||
      id == "t-negative" || id == "scale-nan" || id == "qed-no-arm" || id == "gdn2-with-arm")
    return k::validate_problem(fn, p);
  if (id == "q-null") in.q.data = nullptr;
  else if (id == "beta-for-gdn2") in.beta = seq(1);
  else if (id == "lambda-missing") p.variant = reference::Variant::qed, p.arm = reference::Arm::full, fill_inputs(), in.lambda = nullptr;
  else if (id == "r-missing") p.variant = reference::Variant::qed, p.arm = reference::Arm::rand, fill_inputs(), in.r = nullptr;
  else if (id == "stride-zero") in.q.stride_t = 0;
  else if (id == "stride-negative") in.k.stride_h = -1;
  else if (id == "dtype-7") in.v.dtype = static_cast<k::DType>(7);
  else if (id == "h0-misaligned") in.h0 = k::state_tensor(buf + 1, p.H, p.K, p.V);
  else if (id == "h0-stride") in.h0 = k::state_tensor(buf, p.H, p.K, p.V), in.h0.stride_k = 18;
  if (id == "dq-null" || id == "dh0-null") {
    if (id == "dq-null") gr.dq.data = nullptr;
    else gr.dh0.data = nullptr;
    return k::validate_grads("recurrent_backward", p, gr);
  }
  if (id == "o-stride") {
    auto o = seq_out(p.V);
    o.stride_b = -4;
    return k::validate_output(fn, "o", p, o);
  }
  return k::validate_inputs(fn, p, in);
}

}  // namespace
#endif

// Kernel host API (kernels/api.hpp): the validation every entry point runs before any CUDA
// call, so it is checked without a GPU, in every build that compiles the kernels.
TEST(Robustness, KernelHostApiTableMatches) {
#ifndef QEDCHECK_HAVE_CUDA
  GTEST_SKIP() << "CUDA kernels are not built here; the kernel host API rows of " << kTable
               << " are checked in CUDA builds (validation needs no GPU)";
#else
  const auto rows = read_table("Kernel host API");
  ASSERT_GE(rows.size(), 15u) << "kernel table rows not found in " << kTable;
  const bool print = std::getenv("QEDCHECK_ROBUSTNESS_PRINT") != nullptr;
  for (const auto& row : rows) {
    SCOPED_TRACE("row " + row.id + " (" + row.input + ")");
    const k::Status s = kernel_row(row.id);
    if (print)
      std::printf("| %s | %s | `%s` | %s | `%s` |\n", row.id.c_str(), row.input.c_str(), row.command.c_str(),
                  code_name(s.code), s.message.c_str());
    // The exit column holds the status code's name for these rows.
    EXPECT_EQ(code_name(s.code), row.status);
    EXPECT_EQ(s.message, row.message);
  }
#endif
}
