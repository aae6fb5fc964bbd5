#include "fuzz/shrink.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <chrono>
#include <numeric>

#include "fuzz/case_edit.hpp"

namespace qed::fuzz {

namespace {

using Clock = std::chrono::steady_clock;

class Shrinker {
 public:
  Shrinker(const fixtures::Case& c, const Predicate& p, const ShrinkOptions& o)
      : cur_(c), fails_(p), opt_(o), t0_(Clock::now()), cost_(cost(c)) {}

  fixtures::Case run(ShrinkStats* stats) {
    bool progress = true;
    while (progress && !out_of_budget()) {
      progress = false;
      progress |= cotangents();
      progress |= sequences();
      progress |= axis('T');
      progress |= axis('H');
      progress |= axis('K');
      progress |= axis('V');
      progress |= h0_and_scale();
      progress |= values();
    }
    if (stats) {
      stats->evals = evals_;
      stats->accepted = accepted_;
      stats->seconds = elapsed();
      stats->budget_hit = out_of_budget();
    }
    return cur_;
  }

 private:
  fixtures::Case cur_;
  const Predicate& fails_;
  ShrinkOptions opt_;
  Clock::time_point t0_;
  int64_t evals_ = 0, accepted_ = 0;
  double cost_ = 0;  // cost(cur_)

  double elapsed() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }
  bool out_of_budget() const { return evals_ >= opt_.max_evals || elapsed() >= opt_.seconds; }

  // How complicated the values are: 0 for zero, 1 for +-1, else 2 + significant bits; the scale
  // counts 0 at 1, 1 at 0.5, 2 otherwise. Value edits must lower it, so shrinking terminates.
  static double cost(const fixtures::Case& c) {
    double total = c.inputs.scale == 1.0 ? 0 : c.inputs.scale == 0.5 ? 1 : 2;
    fixtures::Case copy = c;
    for_each_tensor(copy, [&](const std::string&, std::vector<double>& x) {
      for (double e : x) {
        if (e == 0) continue;
        if (e == 1 || e == -1) {
          total += 1;
          continue;
        }
        int exp = 0;
        const auto mant = static_cast<uint64_t>(std::ldexp(std::fabs(std::frexp(e, &exp)), 53));
        total += 2 + (mant ? 53 - std::countr_zero(mant) : 0);  // significant bits
      }
    });
    return total;
  }

  // Accepts `cand` when it is a valid case that still fails (and, for value edits, is simpler).
  bool attempt(const fixtures::Case& cand, const char* what, bool value_edit = false) {
    if (out_of_budget()) return false;
    if (value_edit && !(cost(cand) < cost_)) return false;
    try {
      fixtures::validate_case(cand, "shrink");
    } catch (const qed::Error&) {
      return false;
    }
    ++evals_;
    if (!fails_(cand)) return false;
    cur_ = cand;
    cost_ = cost(cur_);
    ++accepted_;
    if (opt_.log) fmt::print(opt_.log, "  shrink: {:<22} -> {}\n", what, describe(cur_));
    return true;
  }

  bool cotangents() {
    if (!cur_.cotangents) return false;
    fixtures::Case c = cur_;
    c.cotangents.reset();
    if (attempt(c, "no cotangents")) return true;
    if (cur_.cotangents->dht.empty()) return false;
    c = cur_;
    c.cotangents->dht.clear();
    return attempt(c, "no dht");
  }

  bool sequences() {
    bool any = false;
    for (int64_t n = cur_.inputs.num_sequences() - 1; n >= 0 && cur_.inputs.num_sequences() > 1; --n)
      any |= attempt(drop_sequence(cur_, n), "drop sequence");
    if (cur_.inputs.cu_seqlens.size() == 2) {
      fixtures::Case c = cur_;
      c.inputs.cu_seqlens.clear();
      any |= attempt(c, "unpack");
    }
    return any;
  }

  int64_t extent(char ax) const {
    const auto& d = cur_.inputs.dims;
    return ax == 'T' ? d.T : ax == 'H' ? d.H : ax == 'K' ? d.K : d.V;
  }

  // Delta debugging along one axis: remove blocks of halving size while the failure persists.
  bool axis(char ax) {
    bool any = false;
    for (int64_t size = extent(ax) / 2; size >= 1; size /= 2) {
      int64_t start = 0;
      while (start < extent(ax) && extent(ax) > 1 && !out_of_budget()) {
        const int64_t n = extent(ax);
        std::vector<int64_t> keep;
        for (int64_t i = 0; i < n; ++i)
          if (i < start || i >= start + size) keep.push_back(i);
        if (keep.empty()) break;
        Keep k;
        (ax == 'T' ? k.T : ax == 'H' ? k.H : ax == 'K' ? k.K : k.V) = keep;
        const std::string what = fmt::format("{} {} -> {}", ax, n, keep.size());
        if (attempt(apply_keep(cur_, k), what.c_str())) any = true;
        else start += size;
      }
    }
    return any;
  }

  bool h0_and_scale() {
    bool any = false;
    if (!cur_.inputs.h0.empty()) {
      fixtures::Case c = cur_;
      c.inputs.h0.clear();
      any |= attempt(c, "no h0");
    }
    for (double s : {1.0, 0.5}) {
      if (cur_.inputs.scale == s) break;
      fixtures::Case c = cur_;
      c.inputs.scale = s;
      if (attempt(c, "scale", true)) {
        any = true;
        break;
      }
    }
    return any;
  }

  // Replaces a whole tensor, then single elements, by simpler values.
  bool values() {
    bool any = false;
    std::vector<std::string> names;
    for_each_tensor(cur_, [&](const std::string& n, std::vector<double>&) { names.push_back(n); });
    for (const auto& name : names) {
      const bool gate = name == "b" || name == "w" || name == "beta";
      for (double fill : gate ? std::vector<double>{0.0, 1.0} : std::vector<double>{0.0, 1.0, -1.0}) {
        fixtures::Case c = cur_;
        std::vector<double>* x = tensor(c, name);
        if (std::all_of(x->begin(), x->end(), [&](double e) { return e == fill; })) break;
        std::fill(x->begin(), x->end(), fill);
        if (attempt(c, (name + " := " + fmt::format("{}", fill)).c_str(), true)) {
          any = true;
          break;
        }
      }
      for (int bits : {1, 2, 4, 8}) {
        fixtures::Case c = cur_;
        std::vector<double>* x = tensor(c, name);
        bool changed = false;
        for (double& e : *x) {
          const double r = round_bits(e, bits);
          changed |= r != e;
          e = r;
        }
        if (changed && attempt(c, fmt::format("{} to {} bits", name, bits).c_str(), true)) {
          any = true;
          break;
        }
      }
    }
    // Element by element only on small cases: the evaluations grow with the element count.
    if (element_count(cur_) > 2048) return any;
    for (const auto& name : names) {
      const size_t n = tensor(cur_, name) ? tensor(cur_, name)->size() : 0;
      for (size_t i = 0; i < n && !out_of_budget(); ++i) {
        const double e = (*tensor(cur_, name))[i];
        for (double simple : {0.0, round_bits(e, 1), round_bits(e, 2), round_bits(e, 4)}) {
          if (simple == e) break;
          fixtures::Case c = cur_;
          (*tensor(c, name))[i] = simple;
          if (attempt(c, fmt::format("{}[{}] := {}", name, i, simple).c_str(), true)) {
            any = true;
            break;
          }
        }
      }
    }
    return any;
  }
};

}  // namespace

fixtures::Case shrink(const fixtures::Case& failing, const Predicate& still_fails, const ShrinkOptions& opt,
                      ShrinkStats* stats) {
  Shrinker s(failing, still_fails, opt);
  return s.run(stats);
}

}  // namespace qed::fuzz
