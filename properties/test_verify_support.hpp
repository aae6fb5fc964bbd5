// Helpers shared by the verify tests: a scratch folder per test, running the qedcheck binary
// (QEDCHECK_BIN, set by properties/verify.cmake) and reading its JSON verdict.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "fixtures/case.hpp"

namespace qed::verify_test {

namespace fs = std::filesystem;

inline fs::path golden_dir() { return fs::path(QEDCHECK_SOURCE_DIR) / "fixtures" / "golden"; }

inline fixtures::Case golden(const std::string& name) {
  return fixtures::read_case((golden_dir() / (name + ".h5")).string());
}

// A fresh folder named after the running test, removed when the test passes.
class Scratch {
 public:
  Scratch() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("qedcheck-" + std::string(info->test_suite_name()) + "-" + info->name() + "-" +
            std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~Scratch() {
    if (!::testing::Test::HasFailure()) {
      std::error_code ec;
      fs::remove_all(dir_, ec);
    }
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
};

struct CliResult {
  int code = -1;
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::string quote(const std::string& s) { return "'" + s + "'"; }

// Runs `qedcheck ARGS` with stdout and stderr captured into the scratch folder.
inline CliResult qedcheck(const Scratch& s, const std::string& args) {
  const std::string out = s.path("stdout.txt"), err = s.path("stderr.txt");
  const std::string cmd = quote(QEDCHECK_BIN) + " " + args + " >" + quote(out) + " 2>" + quote(err);
  const int st = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

inline const nlohmann::json& dataset(const nlohmann::json& verdict, const std::string& name) {
  for (const auto& d : verdict.at("datasets"))
    if (d.at("name") == name) return d;
  throw std::runtime_error("verdict has no dataset " + name);
}

}  // namespace qed::verify_test
