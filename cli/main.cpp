// qedcheck: one binary, one verb per task. Exit codes: 0 success/pass, 1 numerical failure,
// 2 bad input or usage (one clear line on stderr), 3 internal error.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>

#include "cli/verbs.hpp"
#include "verify/certificate.hpp"
#ifdef QEDCHECK_HAVE_CUDA
#include "kernels/api.hpp"
#endif
#include "reference/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "qedcheck: arbitrary-precision reference, property tests and verification for delta-rule "
      "linear attention (GDN-2, QED, KDA, Gated DeltaNet, DeltaNet)",
      "qedcheck"};
  app.require_subcommand(1);
  // the version, and what this binary was built from (certificates record the same)
  std::string version = "qedcheck 0.1.0, built from commit " + qed::verify::build_commit() + " (" +
                        qed::verify::build_tree_state() + " tree)";
#ifdef QEDCHECK_HAVE_CUDA
  version += ", CUDA kernels " + std::string(qed::kernels::source_fingerprint());
#endif
  app.set_version_flag("--version", version);
  qed::cli::Action action;
  auto verbs = qed::cli::verb_registry();
  std::sort(verbs.begin(), verbs.end(), [](const auto& a, const auto& b) { return a.order < b.order; });
  for (auto& v : verbs) v.setup(app, action);
  if (argc >= 2 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (const CLI::App* sub : app.get_subcommands({})) {
      known = known || sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "qedcheck: usage error: unknown verb '%s' (verbs: %s)\n", argv[1],
                   names.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "qedcheck: usage error: %s (see qedcheck --help)\n", e.what());
    return 2;
  }
  try {
    return action ? action() : 2;
  } catch (const qed::Error& e) {
    std::fprintf(stderr, "qedcheck: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "qedcheck: error: out of memory\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qedcheck: internal error: %s\n", e.what());
    return 3;
  }
}
