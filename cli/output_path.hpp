// Rules every verb follows before writing a file: never write over an input, never replace an
// existing file unless --force was given, and fail early when the folder cannot be written.
#pragma once

#include <filesystem>
#include <string>
#include <unistd.h>

#include "reference/error.hpp"

namespace qed::cli {

inline void check_output_path(const std::string& out, const std::string& in, bool force) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (out.empty()) throw qed::Error("no output file given (-o OUT.h5)");
  if (fs::exists(in, ec) && fs::exists(out, ec) && fs::equivalent(in, out, ec))
    throw qed::Error(out + ": output is the input file (rule: an input is never overwritten)");
  if (fs::exists(out, ec) && !force)
    throw qed::Error(out + ": file exists (rule: existing files are kept; pass --force to replace)");
  fs::path dir = fs::path(out).parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::is_directory(dir, ec))
    throw qed::Error(out + ": folder " + dir.string() + " does not exist (rule: the output folder must exist and be writable)");
  if (::access(dir.c_str(), W_OK) != 0)
    throw qed::Error(out + ": folder " + dir.string() + " is not writable (rule: the output folder must exist and be writable)");
}

}  // namespace qed::cli
