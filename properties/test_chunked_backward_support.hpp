// Shared by the chunked-backward tests (CPU: test_chunked_backward_tiles.cpp, GPU:
// test_gpu_chunked_backward.cpp): a host emulation of the CUDA backward that runs the very block
// functions of kernels/chunked_backward_tile.hpp with SerialExec on host memory, the gradient
// comparison and the tolerance rule.
//
// Tolerance rule (also in kernels/chunked_backward.cu): for every gradient X,
//   relF(X) <= 4 max(relF_twin32(X), relF_rec32(X)) + 1e-6
// where relF(x) = ||x - ref||_F / ||ref||_F against the double recurrent reference on the same
// (rounded) inputs, twin32 = reference::chunked_backward<float> (C = 64, operands none: the CPU
// fp32 twin of this kernel's arithmetic) and rec32 = reference::recurrent_backward<float>.
// 4x covers the different summation orders (and expf) of an fp32 kernel against the fp32 twin;
// 1e-6 (about 16 u_fp32) keeps gradients whose twin error is at the roundoff floor from failing
// on a few ulps. dlambda, a sum with heavy cancellation, is judged by the same rule: the twin's
// own error carries the cancellation.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/chunked_backward_tile.hpp"
#include "reference/chunked.hpp"
#include "reference/recurrent.hpp"
#include "reference/types.hpp"

namespace qed::chunked_bwd_test {

using namespace qed::reference;
namespace kb = qed::kernels::chunked_bwd;

inline float round_bf16(double x) { return kb::bf16_to_float(kb::float_to_bf16(static_cast<float>(x))); }

// Inputs as a kernel with inputs of this dtype consumes them (bf16: sequence tensors and lambda,
// r rounded to bf16; fp32: to float), h0 and scale to float; cotangents do likewise, dht to float.
inline Inputs<double> round_case(const Inputs<double>& in, bool bf16) {
  Inputs<double> o = in;
  auto r = [&](std::vector<double>& x) {
    for (auto& e : x) e = bf16 ? round_bf16(e) : static_cast<float>(e);
  };
  for (auto* t : {&o.q, &o.k, &o.v, &o.g, &o.b, &o.w, &o.beta, &o.lambda, &o.r}) r(*t);
  for (auto& e : o.h0) e = static_cast<float>(e);
  o.scale = static_cast<float>(in.scale);
  return o;
}
inline Cotangents<double> round_cot(const Cotangents<double>& c, bool bf16) {
  Cotangents<double> o = c;
  for (auto& e : o.do_) e = bf16 ? round_bf16(e) : static_cast<float>(e);
  for (auto& e : o.dht) e = static_cast<float>(e);
  return o;
}

// Host copy of a sequence tensor in the kernel's dtype.
struct HostSeq {
  std::vector<float> f;
  std::vector<uint16_t> h;
  kb::SeqIn view(bool bf16, int64_t T, int64_t H, int64_t D) {
    kb::SeqIn s;
    s.sb = T * H * D;
    s.st = H * D;
    s.sh = D;
    s.dt = bf16 ? 1 : 0;
    s.p = bf16 ? static_cast<const void*>(h.data()) : static_cast<const void*>(f.data());
    return s;
  }
};
inline HostSeq host_seq(const std::vector<double>& x, bool bf16) {
  HostSeq s;
  if (bf16) {
    s.h.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) s.h[i] = kb::float_to_bf16(static_cast<float>(x[i]));
  } else {
    s.f.assign(x.begin(), x.end());
  }
  return s;
}

struct EmulOptions {
  bool bf16 = false;     // input dtype
  bool bf16_out = false; // gradient dtype (dq dk dv dg db dw dbeta)
  int exec_mode = 0;     // SerialExec order
  int mutant = kb::kMutantNone;
  // Chunk-start states to use (the GPU forward's); null: reference::chunked_forward<float>'s.
  const std::vector<double>* chunk_states = nullptr;
};

// The whole backward pipeline of kernels/chunked_backward.cu on the host. `in`, `cot` must
// already hold the values the kernel consumes (round_case / round_cot).
inline Grads<double> emulate(const Inputs<double>& in, const Cotangents<double>& cot,
                             const EmulOptions& eo) {
  const auto& d = in.dims;
  const Layout lay = layout_of(in.variant, in.arm);
  const int64_t B = d.B, T = d.T, H = d.H, K = d.K, V = d.V, N = in.num_sequences();
  const bool varlen = !in.cu_seqlens.empty();
  const int64_t per = (T + kb::kC - 1) / kb::kC;
  const int64_t bound = varlen ? per + N : B * per;

  // Forward recompute (the CUDA forward's role): chunk-start states in fp32.
  std::vector<float> cs(static_cast<size_t>(bound * H * K * V), NAN);
  {
    std::vector<double> csd;
    if (eo.chunk_states) {
      csd = *eo.chunk_states;
    } else {
      std::vector<float> c32;
      ChunkOptions opt;
      (void)chunked_forward(convert_inputs<float>(in), opt, &c32);
      csd = convert<double>(c32);
    }
    for (size_t i = 0; i < csd.size() && i < cs.size(); ++i) cs[i] = static_cast<float>(csd[i]);
  }
  std::vector<int64_t> base;
  if (varlen) base = chunk_bases(in, kb::kC);

  HostSeq q = host_seq(in.q, eo.bf16), k = host_seq(in.k, eo.bf16), v = host_seq(in.v, eo.bf16),
          g = host_seq(in.g, eo.bf16), b = host_seq(in.b, eo.bf16), w = host_seq(in.w, eo.bf16),
          beta = host_seq(in.beta, eo.bf16), dout = host_seq(cot.do_, eo.bf16);
  const std::vector<float> lam(in.lambda.begin(), in.lambda.end()), r(in.r.begin(), in.r.end()),
      dht(cot.dht.begin(), cot.dht.end());

  kb::BwdArgs A;
  A.variant = static_cast<int>(in.variant);
  A.arm = static_cast<int>(in.arm);
  A.B = B, A.T = T, A.H = H, A.K = K, A.V = V, A.N = N;
  A.scale = static_cast<float>(in.scale);
  A.cu = varlen ? in.cu_seqlens.data() : nullptr;
  A.chunk_base = varlen ? base.data() : nullptr;
  A.chunks_per_seq = per;
  A.chunk_bound = bound;
  A.q = q.view(eo.bf16, T, H, K);
  A.k = k.view(eo.bf16, T, H, K);
  A.v = v.view(eo.bf16, T, H, V);
  if (lay.channel_g) A.g = g.view(eo.bf16, T, H, K);
  if (lay.scalar_g) A.g = g.view(eo.bf16, T, H, 1);
  if (lay.has_bw) {
    A.b = b.view(eo.bf16, T, H, K);
    A.w = w.view(eo.bf16, T, H, V);
  }
  if (lay.has_beta) A.beta = beta.view(eo.bf16, T, H, 1);
  A.dout = dout.view(eo.bf16, T, H, V);
  A.lambda = lay.has_lambda ? lam.data() : nullptr;
  A.r = lay.has_r ? r.data() : nullptr;
  if (!dht.empty()) {
    A.dht = dht.data();
    A.dht_sn = H * K * V, A.dht_sh = K * V, A.dht_sk = V;
  }
  A.cs = cs.data();
  std::vector<float> dh0(static_cast<size_t>(N * H * K * V), NAN);
  A.dh0 = dh0.data();
  A.dh0_sn = H * K * V, A.dh0_sh = K * V, A.dh0_sk = V;
  A.n_vt = static_cast<int>((V + kb::kVT - 1) / kb::kVT);
  std::vector<float> blob(static_cast<size_t>(bound * H * kb::blob_floats(K, V)), NAN);
  std::vector<float> part(static_cast<size_t>(bound * H * A.n_vt * kb::part_floats(K)), NAN);
  const int64_t BTH = B * T * H;
  std::vector<float> tok_k(static_cast<size_t>(4 * BTH * K), NAN), tok_v(static_cast<size_t>(BTH * V), NAN);
  std::vector<float> dlam_tok(static_cast<size_t>(BTH), NAN), dr_tok(static_cast<size_t>(BTH * K), NAN);
  A.blob = blob.data();
  A.part = part.data();
  A.tok_k = tok_k.data();
  A.tok_v = tok_v.data();
  A.dlam_tok = dlam_tok.data();
  A.dr_tok = dr_tok.data();
  A.mutant = eo.mutant;

  // Gradient outputs (NaN-poisoned, as the GPU host run does).
  const int odt = eo.bf16_out ? 1 : 0;
  auto out_buf = [&](int64_t D, bool has) {
    return std::vector<float>(has ? static_cast<size_t>(B * T * H * D) : 0, NAN);
  };
  std::vector<float> dq = out_buf(K, true), dk = out_buf(K, true), dv = out_buf(V, true),
                     dg = out_buf(lay.channel_g ? K : 1, lay.channel_g || lay.scalar_g),
                     db = out_buf(K, lay.has_bw), dw = out_buf(V, lay.has_bw),
                     dbeta = out_buf(1, lay.has_beta);
  std::vector<uint16_t> dq16, dk16, dv16, dg16, db16, dw16, dbeta16;
  auto bind = [&](std::vector<float>& f, std::vector<uint16_t>& h16, int64_t D) {
    kb::SeqOut s;
    if (f.empty()) return s;
    s.sb = T * H * D, s.st = H * D, s.sh = D, s.dt = odt;
    if (odt) {
      h16.assign(f.size(), 0x7fc0);
      s.p = h16.data();
    } else {
      s.p = f.data();
    }
    return s;
  };
  A.dq = bind(dq, dq16, K);
  A.dk = bind(dk, dk16, K);
  A.dv = bind(dv, dv16, V);
  A.dg = bind(dg, dg16, lay.channel_g ? K : 1);
  A.db = bind(db, db16, K);
  A.dw = bind(dw, dw16, V);
  A.dbeta = bind(dbeta, dbeta16, 1);

  const kb::SerialExec ex{eo.exec_mode};
  std::vector<float> sm(static_cast<size_t>(std::max({kb::prep_smem_floats(K), kb::chunk_smem_floats(K),
                                                      kb::state_smem_floats(K)})));
  for (int64_t gc = 0; gc < bound; ++gc)
    for (int64_t h = 0; h < H; ++h) kb::prep_block(ex, A, gc, h, sm.data());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h)
      for (int vt = 0; vt < A.n_vt; ++vt) kb::state_block(ex, A, n, h, vt, sm.data());
  for (int64_t gc = 0; gc < bound; ++gc)
    for (int64_t h = 0; h < H; ++h) kb::chunk_block(ex, A, gc, h, sm.data());
  for (int64_t item = 0; item < BTH; ++item) kb::token_item(A, item, 0, 1, kb::SoloSum{});
  std::vector<float> dlam(static_cast<size_t>(H), NAN), dr(static_cast<size_t>(H * K), NAN);
  std::vector<float> scratch(kb::reduce_smem_floats());
  std::vector<float> red(static_cast<size_t>(kb::reduce_part_floats(B * T, H, static_cast<int>(K))));
  auto reduce = [&](const std::vector<float>& tok, int D, std::vector<float>& out) {
    for (int64_t h = 0; h < H; ++h)
      for (int64_t p = 0; p < kb::reduce_parts(B * T); ++p)
        kb::head_reduce_parts(ex, tok.data(), B * T, H, D, h, p, red.data(), scratch.data());
    for (int64_t h = 0; h < H; ++h) kb::head_reduce_final(ex, red.data(), B * T, H, D, h, out.data());
  };
  if (lay.has_lambda) reduce(dlam_tok, 1, dlam);
  if (lay.has_r) reduce(dr_tok, static_cast<int>(K), dr);

  auto back = [&](std::vector<float>& f, const std::vector<uint16_t>& h16) {
    std::vector<double> o(f.size());
    for (size_t i = 0; i < f.size(); ++i) o[i] = odt ? kb::bf16_to_float(h16[i]) : f[i];
    return o;
  };
  Grads<double> gr;
  gr.dq = back(dq, dq16);
  gr.dk = back(dk, dk16);
  gr.dv = back(dv, dv16);
  if (lay.channel_g || lay.scalar_g) gr.dg = back(dg, dg16);
  if (lay.has_bw) {
    gr.db = back(db, db16);
    gr.dw = back(dw, dw16);
  }
  if (lay.has_beta) gr.dbeta = back(dbeta, dbeta16);
  if (lay.has_lambda) gr.dlambda = convert<double>(dlam);
  if (lay.has_r) gr.dr = convert<double>(dr);
  gr.dh0 = convert<double>(dh0);
  return gr;
}

// ||x - r||_F / ||r||_F (NaN when x has a non-finite entry or the sizes differ).
inline double relF(const std::vector<double>& x, const std::vector<double>& r) {
  if (x.size() != r.size()) return NAN;
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) return NAN;
    num += (x[i] - r[i]) * (x[i] - r[i]);
    den += r[i] * r[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The same size and the same bits (-0 is not 0, and a NaN equals itself bit for bit).
inline bool same_bits(const std::vector<double>& x, const std::vector<double>& y) {
  return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0);
}

inline std::vector<std::pair<std::string, const std::vector<double>*>> fields(const Grads<double>& g) {
  std::vector<std::pair<std::string, const std::vector<double>*>> out;
  const std::pair<const char*, const std::vector<double>*> all[] = {
      {"dq", &g.dq}, {"dk", &g.dk},       {"dv", &g.dv},           {"dg", &g.dg}, {"db", &g.db},
      {"dw", &g.dw}, {"dbeta", &g.dbeta}, {"dlambda", &g.dlambda}, {"dr", &g.dr}, {"dh0", &g.dh0}};
  for (const auto& [n, p] : all)
    if (!p->empty()) out.emplace_back(n, p);
  return out;
}

// Per-gradient errors of x against ref and the bound of the rule above.
struct GradCheck {
  std::string name;
  double err = 0, twin32 = 0, rec32 = 0, bound = 0;
  bool ok() const { return err <= bound; }
};

struct Refs {
  Grads<double> exact;  // double recurrent
  Grads<double> twin32, rec32;
};

inline Refs references(const Inputs<double>& in, const Cotangents<double>& cot) {
  Refs r;
  r.exact = recurrent_backward(in, cot);
  ChunkOptions opt;
  const auto in32 = convert_inputs<float>(in);
  const auto cot32 = convert_cotangents<float>(cot);
  const Grads<float> t = chunked_backward(in32, cot32, opt);
  const Grads<float> c = recurrent_backward(in32, cot32);
  auto cv = [](const Grads<float>& g) {
    Grads<double> o;
    o.dq = convert<double>(g.dq), o.dk = convert<double>(g.dk), o.dv = convert<double>(g.dv);
    o.dg = convert<double>(g.dg), o.db = convert<double>(g.db), o.dw = convert<double>(g.dw);
    o.dbeta = convert<double>(g.dbeta), o.dlambda = convert<double>(g.dlambda);
    o.dr = convert<double>(g.dr), o.dh0 = convert<double>(g.dh0);
    return o;
  };
  r.twin32 = cv(t);
  r.rec32 = cv(c);
  return r;
}

inline std::vector<GradCheck> check_grads(const Grads<double>& x, const Refs& R,
                                          double factor = 4.0, double floor = 1e-6) {
  std::vector<GradCheck> out;
  const auto fx = fields(x), fe = fields(R.exact), ft = fields(R.twin32), fr = fields(R.rec32);
  for (size_t i = 0; i < fe.size(); ++i) {
    GradCheck c;
    c.name = fe[i].first;
    const std::vector<double>* xi = nullptr;
    for (const auto& [n, p] : fx)
      if (n == c.name) xi = p;
    c.err = xi ? relF(*xi, *fe[i].second) : NAN;
    c.twin32 = relF(*ft[i].second, *fe[i].second);
    c.rec32 = relF(*fr[i].second, *fe[i].second);
    c.bound = factor * std::max(c.twin32, c.rec32) + floor;
    out.push_back(c);
  }
  return out;
}

}  // namespace qed::chunked_bwd_test
