#include "fuzz/case_edit.hpp"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <numeric>

namespace qed::fuzz {

using reference::Dims;
using reference::Layout;

namespace {

std::vector<int64_t> all(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

// x has extents `dims` (row-major, 4 axes); keeps idx[a] along axis a.
std::vector<double> gather(const std::vector<double>& x, const std::array<int64_t, 4>& dims,
                           const std::array<const std::vector<int64_t>*, 4>& idx) {
  if (x.empty()) return x;
  std::vector<double> out;
  out.reserve(idx[0]->size() * idx[1]->size() * idx[2]->size() * idx[3]->size());
  for (int64_t i0 : *idx[0])
    for (int64_t i1 : *idx[1])
      for (int64_t i2 : *idx[2])
        for (int64_t i3 : *idx[3])
          out.push_back(x[static_cast<size_t>(((i0 * dims[1] + i1) * dims[2] + i2) * dims[3] + i3)]);
  return out;
}

}  // namespace

fixtures::Case apply_keep(const fixtures::Case& c, const Keep& keep) {
  const auto& in = c.inputs;
  const Dims& d = in.dims;
  const bool varlen = !in.cu_seqlens.empty();
  const int64_t N = in.num_sequences();
  const std::vector<int64_t> one = {0};
  const std::vector<int64_t> B = keep.B.value_or(all(d.B));
  const std::vector<int64_t> H = keep.H.value_or(all(d.H));
  const std::vector<int64_t> K = keep.K.value_or(all(d.K));
  const std::vector<int64_t> V = keep.V.value_or(all(d.V));
  std::vector<int64_t> T = keep.T.value_or(all(d.T));
  std::vector<int64_t> Nk = keep.N.value_or(varlen ? all(N) : B);

  fixtures::Case out;
  out.path = c.path;
  out.dtype = c.dtype;
  out.producer = c.producer;
  auto& o = out.inputs;
  o.variant = in.variant;
  o.arm = in.arm;
  o.scale = in.scale;

  if (varlen) {
    // Tokens of dropped sequences go too; each kept sequence keeps its kept tokens.
    std::vector<bool> seq_kept(static_cast<size_t>(N), false);
    for (int64_t n : Nk) seq_kept[static_cast<size_t>(n)] = true;
    std::vector<bool> tok_kept(static_cast<size_t>(d.T), false);
    for (int64_t t : T) tok_kept[static_cast<size_t>(t)] = true;
    std::vector<int64_t> T2;
    o.cu_seqlens = {0};
    for (int64_t n = 0; n < N; ++n) {
      if (!seq_kept[static_cast<size_t>(n)]) continue;
      int64_t len = 0;
      for (int64_t t = in.cu_seqlens[n]; t < in.cu_seqlens[n + 1]; ++t)
        if (tok_kept[static_cast<size_t>(t)]) {
          T2.push_back(t);
          ++len;
        }
      o.cu_seqlens.push_back(o.cu_seqlens.back() + len);
    }
    T = std::move(T2);
  } else {
    Nk = B;
  }
  o.dims = {static_cast<int64_t>(B.size()), static_cast<int64_t>(T.size()), static_cast<int64_t>(H.size()),
            static_cast<int64_t>(K.size()), static_cast<int64_t>(V.size())};
  const Layout lay = reference::layout_of(in.variant, in.arm);
  auto tokens = [&](const std::vector<double>& x, int64_t D, const std::vector<int64_t>& idx) {
    return gather(x, {d.B, d.T, d.H, D}, {&B, &T, &H, &idx});
  };
  auto state = [&](const std::vector<double>& x) { return gather(x, {N, d.H, d.K, d.V}, {&Nk, &H, &K, &V}); };
  o.q = tokens(in.q, d.K, K);
  o.k = tokens(in.k, d.K, K);
  o.v = tokens(in.v, d.V, V);
  o.g = lay.scalar_g ? tokens(in.g, 1, one) : tokens(in.g, d.K, K);
  o.b = tokens(in.b, d.K, K);
  o.w = tokens(in.w, d.V, V);
  o.beta = tokens(in.beta, 1, one);
  o.lambda = gather(in.lambda, {1, 1, d.H, 1}, {&one, &one, &H, &one});
  o.r = gather(in.r, {1, 1, d.H, d.K}, {&one, &one, &H, &K});
  o.h0 = state(in.h0);
  if (c.cotangents) {
    out.cotangents.emplace();
    out.cotangents->do_ = tokens(c.cotangents->do_, d.V, V);
    out.cotangents->dht = state(c.cotangents->dht);
  }
  return out;
}

fixtures::Case drop_sequence(const fixtures::Case& c, int64_t n) {
  const int64_t N = c.inputs.num_sequences();
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < N; ++i)
    if (i != n) kept.push_back(i);
  Keep k;
  if (c.inputs.cu_seqlens.empty()) k.B = kept;
  else k.N = kept;
  return apply_keep(c, k);
}

std::vector<double>* tensor(fixtures::Case& c, const std::string& name) {
  auto& in = c.inputs;
  if (name == "q") return &in.q;
  if (name == "k") return &in.k;
  if (name == "v") return &in.v;
  if (name == "g") return &in.g;
  if (name == "b") return &in.b;
  if (name == "w") return &in.w;
  if (name == "beta") return &in.beta;
  if (name == "lambda") return &in.lambda;
  if (name == "r") return &in.r;
  if (name == "h0") return &in.h0;
  if (name == "do") return c.cotangents ? &c.cotangents->do_ : nullptr;
  if (name == "dht") return c.cotangents ? &c.cotangents->dht : nullptr;
  return nullptr;
}

void for_each_tensor(fixtures::Case& c, const std::function<void(const std::string&, std::vector<double>&)>& f) {
  for (const char* name : {"q", "k", "v", "g", "b", "w", "beta", "lambda", "r", "h0", "do", "dht"}) {
    std::vector<double>* x = tensor(c, name);
    if (x && !x->empty()) f(name, *x);
  }
}

int64_t element_count(const fixtures::Case& c) {
  int64_t n = 0;
  fixtures::Case copy = c;
  for_each_tensor(copy, [&](const std::string&, std::vector<double>& x) { n += static_cast<int64_t>(x.size()); });
  return n;
}

double round_bits(double x, int bits) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = 0;
  const double m = std::frexp(x, &e);  // |m| in [0.5, 1)
  return std::ldexp(std::round(std::ldexp(m, bits)), e - bits);
}

std::string describe(const fixtures::Case& c) {
  const auto& in = c.inputs;
  const auto& d = in.dims;
  const bool qed = in.variant == reference::Variant::qed;
  return fmt::format("{}{}{} B={} T={} H={} K={} V={} N={}{}{}{} dtype={}", reference::to_string(in.variant),
                     qed ? "/" : "", qed ? reference::to_string(in.arm) : "", d.B, d.T, d.H, d.K, d.V,
                     in.num_sequences(),
                     in.cu_seqlens.empty() ? "" : fmt::format(" cu_seqlens=[{}]", fmt::join(in.cu_seqlens, ",")),
                     in.h0.empty() ? "" : " h0", !c.cotangents ? "" : c.cotangents->dht.empty() ? " do" : " do+dht",
                     c.dtype);
}

}  // namespace qed::fuzz
