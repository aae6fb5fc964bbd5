#include "fuzz/corpus.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "fixtures/case_patch.hpp"
#include "fixtures/hdf5_util.hpp"
#include "fuzz/case_edit.hpp"

namespace qed::fuzz {

namespace fs = std::filesystem;

namespace {

struct Fnv {
  uint64_t h = 0xcbf29ce484222325ull;
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  }
  void str(const std::string& s) {
    const uint64_t n = s.size();
    bytes(&n, sizeof n);
    bytes(s.data(), s.size());
  }
  template <class T>
  void vec(const std::vector<T>& x) {
    const uint64_t n = x.size();
    bytes(&n, sizeof n);
    if (!x.empty()) bytes(x.data(), x.size() * sizeof(T));
  }
};

std::string file_stem(const std::string& impl_args) {
  // "--impl NAME ..." -> NAME, reduced to file-name-safe characters.
  std::string name = impl_args;
  if (name.rfind("--impl ", 0) == 0) name = name.substr(7);
  name = name.substr(0, name.find(' '));
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_') ch = '_';
  return name.empty() ? "case" : name;
}

}  // namespace

std::string content_hash(const fixtures::Case& c, const std::string& impl_args) {
  Fnv f;
  const auto& in = c.inputs;
  f.str(c.dtype);
  f.str(std::string(reference::to_string(in.variant)));
  f.str(std::string(reference::to_string(in.arm)));
  const int64_t dims[] = {in.dims.B, in.dims.T, in.dims.H, in.dims.K, in.dims.V};
  f.bytes(dims, sizeof dims);
  f.bytes(&in.scale, sizeof in.scale);
  fixtures::Case copy = c;
  for_each_tensor(copy, [&](const std::string& name, std::vector<double>& x) {
    f.str(name);
    f.vec(x);
  });
  f.str("cu_seqlens");
  f.vec(in.cu_seqlens);
  f.str(impl_args);
  return fmt::format("{:016x}", f.h);
}

Saved save_counterexample(const std::string& dir, const fixtures::Case& c, const CorpusMeta& meta) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec)) throw qed::Error(dir + ": cannot create the corpus folder");
  const std::string hash = content_hash(c, meta.impl_args);
  Saved s;
  s.path = (fs::path(dir) / (file_stem(meta.impl_args) + "-" + hash + ".h5")).string();
  if (fs::exists(s.path, ec)) {
    s.existed = true;
    return s;
  }
  fixtures::Case clean = c;
  clean.path.clear();
  clean.outputs.clear();
  clean.grads.clear();
  clean.producer = "qedcheck fuzz";
  const std::string tmp = (fs::path(dir) / fmt::format(".{}.{}.tmp.h5", hash, ::getpid())).string();
  fixtures::write_case(tmp, clean);
  try {
    fixtures::CasePatch p(tmp);
    p.attr_string("/", "fuzz_impl", meta.impl_args);
    p.attr_string("/", "fuzz_seed", std::to_string(meta.seed));  // decimal: u64 exceeds a double
    p.attr_number("/", "fuzz_config", H5T_STD_I64LE, {static_cast<double>(meta.config)});
    p.attr_string("/", "fuzz_found", meta.found);
    p.attr_string("/", "fuzz_original", meta.original);
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
  // link() never replaces: if another run saved the same case meanwhile, theirs stays.
  const int r = ::link(tmp.c_str(), s.path.c_str());
  const int err = errno;
  fs::remove(tmp, ec);
  if (r != 0 && err == EEXIST) {
    s.existed = true;
  } else if (r != 0) {
    throw qed::Error(s.path + ": cannot save the counterexample (" + std::strerror(err) + ")");
  }
  return s;
}

CorpusEntry read_counterexample(const std::string& path) {
  CorpusEntry e;
  e.c = fixtures::read_case(path);
  fixtures::h5::QuietErrors quiet;
  fixtures::h5::Id f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!f.valid()) throw qed::Error(path + ": cannot open");
  fixtures::h5::Id root(H5Oopen(f.get(), "/", H5P_DEFAULT), H5Oclose);
  namespace h5 = fixtures::h5;
  e.meta.impl_args = h5::read_string_attribute(root.get(), "fuzz_impl", path, "/@fuzz_impl").value_or("");
  e.meta.seed = std::strtoull(h5::read_string_attribute(root.get(), "fuzz_seed", path, "/@fuzz_seed").value_or("0").c_str(), nullptr, 10);
  e.meta.config = h5::read_integer_attribute(root.get(), "fuzz_config", path, "/@fuzz_config").value_or(-1);
  e.meta.found = h5::read_string_attribute(root.get(), "fuzz_found", path, "/@fuzz_found").value_or("");
  e.meta.original = h5::read_string_attribute(root.get(), "fuzz_original", path, "/@fuzz_original").value_or("");
  return e;
}

std::vector<std::string> corpus_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() == ".h5" && name[0] != '.') out.push_back(entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace qed::fuzz
