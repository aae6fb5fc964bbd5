// How verbs join the `qedcheck` binary: each cli/verb_*.cpp defines a static RegisterVerb that
// adds its subcommand to the CLI11 app and, when chosen, sets the action to run. main() maps
// qed::Error to exit code 2 with one line on stderr.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace qed::cli {

// The chosen verb's work; returns the process exit code.
using Action = std::function<int()>;
using VerbSetup = std::function<void(CLI::App& app, Action& action)>;

struct VerbEntry {
  int order;  // position in --help
  VerbSetup setup;
};

inline std::vector<VerbEntry>& verb_registry() {
  static std::vector<VerbEntry> verbs;
  return verbs;
}

struct RegisterVerb {
  RegisterVerb(int order, VerbSetup setup) { verb_registry().push_back({order, std::move(setup)}); }
};

}  // namespace qed::cli
