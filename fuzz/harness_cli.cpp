// libFuzzer harness for the command line: the bytes are argv (NUL-separated words, at most 64)
// parsed by the CLI11 app with every registered verb, exactly as main() builds it, without running
// the chosen action. Parsing may only succeed or throw CLI::Error (usage errors, --help) or
// qed::Error; CLI11 printing is not a finding, a crash or any other exception is.
#include <cstdint>
#include <string>
#include <vector>

#include "cli/verbs.hpp"
#include "reference/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> words = {"qedcheck"};
  std::string cur;
  for (size_t i = 0; i < size && words.size() < 64; ++i) {
    if (data[i] == 0) {
      words.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  if (!cur.empty() && words.size() < 64) words.push_back(cur);
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());

  CLI::App app{"qedcheck", "qedcheck"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "qedcheck 0.1.0");
  qed::cli::Action action;
  for (auto& v : qed::cli::verb_registry()) v.setup(app, action);
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::Error&) {
  } catch (const qed::Error&) {
  }
  return 0;
}
