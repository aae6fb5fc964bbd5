// The chunked (WY) reference computes the same function as the recurrent one: P15 in mpfr at
// 256 bits (forward and backward, every variant and arm, C in {1,2,7,16,64,T,>T}, varlen with an
// empty sequence, h0, dht, raw and zero keys), P5 chunk-size invariance, P14 chunk identities,
// P1/P2 with splits off chunk boundaries, the exact factored form, and a mutation check.
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <cstdio>

#include "properties/test_chunked_support.hpp"
#include "reference/chunked.hpp"
#include "reference/recurrent.hpp"
#include "reference/scalar.hpp"

using namespace qed;
using namespace qed::reference;
using namespace qed::chunked_test;

namespace {

// Mutant: the chunked forward with the cross-chunk term Q̃ S of (4.4) forgotten.
template <class S>
Outputs<S> forward_without_cross_chunk_term(const Inputs<S>& in, const ChunkOptions& opt) {
  const auto& d = in.dims;
  Outputs<S> out;
  out.o.assign(static_cast<size_t>(d.B * d.T * d.H * d.V), S(0));
  out.ht.assign(static_cast<size_t>(in.num_sequences() * d.H * d.K * d.V), S(0));
  for (const auto& Lv : lanes_of(in)) {
    std::vector<S> St = detail::initial_state(Lv);
    for (int64_t t0 = 0; t0 < Lv.span.len; t0 += opt.chunk) {
      const Chunk<S> ch = build_chunk(Lv, t0, std::min(opt.chunk, Lv.span.len - t0), opt);
      const std::vector<S> Ur = chunk_pseudo_values(ch, St);
      const std::vector<S> zero(St.size(), S(0));
      for (int64_t r = 0; r < ch.n; ++r)
        chunk_output_row(ch, r, zero, Ur, in.scale, out.o.data() + Lv.tok(t0 + r, d.V));
      chunk_advance_state(ch, Ur, St);
    }
    for (int64_t i = 0; i < d.K * d.V; ++i) out.ht[Lv.state_offset() + i] = St[i];
  }
  return out;
}

template <class S>
Outputs<S> correct_forward(const Inputs<S>& in, const ChunkOptions& opt) {
  return chunked_forward(in, opt);
}

// P15 forward residual of an implementation: worst over C of its distance to the recurrent run.
template <class S, class Fwd>
double p15_forward(const Inputs<S>& in, Fwd fwd, const std::vector<int64_t>& Cs) {
  const Outputs<S> ref = recurrent_forward(in);
  double worst = 0;
  for (int64_t C : Cs) worst = std::max(worst, worst_outputs(fwd(in, ChunkOptions{C}), ref));
  return worst;
}

// P5 forward residual: worst over C of the distance to the same implementation at C = 1.
template <class S, class Fwd>
double p5_forward(const Inputs<S>& in, Fwd fwd, const std::vector<int64_t>& Cs) {
  const Outputs<S> ref = fwd(in, ChunkOptions{1});
  double worst = 0;
  for (int64_t C : Cs) worst = std::max(worst, worst_outputs(fwd(in, ChunkOptions{C}), ref));
  return worst;
}

// The P15 cases: a batched case with a zero key (k_t = 0 exercises the P(0) = I convention),
// and a varlen case with raw (non-unit) keys and an empty sequence.
std::vector<Inputs<double>> p15_cases(Variant v, Arm a, uint64_t seed) {
  std::vector<Inputs<double>> cases;
  auto s = spec_of(v, a, {2, 13, 2, 3, 2}, seed);
  auto in = fixtures::generate(s);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t c = 0; c < 3; ++c) in.k[((0 * 13 + 4) * 2 + h) * 3 + c] = 0.0;
  cases.push_back(in);
  s = spec_of(v, a, {1, 13, 2, 3, 2}, seed + 1);
  s.seqlens = {5, 0, 8};
  s.unit_keys = false;
  cases.push_back(fixtures::generate(s));
  return cases;
}

}  // namespace

TEST(ChunkedP15, MpfrForwardAndBackwardEqualRecurrent) {
  const uint64_t seed = test_seed(15);
  set_mpfr_bits(256);
  const std::vector<int64_t> Cs = {1, 2, 7, 16, 64, 13, 20};
  double worst_f = 0, worst_b = 0;
  for (auto [v, a] : all_variants()) {
    for (const auto& ind : p15_cases(v, a, seed)) {
      const auto in = convert_inputs<mpfr_float>(ind);
      const auto cot =
          convert_cotangents<mpfr_float>(fixtures::generate_cotangents(ind, seed, true));
      const auto rf = recurrent_forward(in);
      const auto rb = recurrent_backward(in, cot);
      for (int64_t C : Cs) {
        std::string wf, wb;
        const double ef = worst_outputs(chunked_forward(in, ChunkOptions{C}), rf, &wf);
        const double eb = worst_grads(chunked_backward(in, cot, ChunkOptions{C}), rb, &wb);
        worst_f = std::max(worst_f, ef);
        worst_b = std::max(worst_b, eb);
        EXPECT_LT(ef, 1e-60) << name_of(v, a) << " C=" << C << " varlen=" << !ind.cu_seqlens.empty()
                             << " worst " << wf << "; " << replay(seed);
        EXPECT_LT(eb, 1e-60) << name_of(v, a) << " C=" << C << " varlen=" << !ind.cu_seqlens.empty()
                             << " worst " << wb << "; " << replay(seed);
      }
    }
  }
  std::printf("P15 mpfr-256: worst forward %.2e, worst backward %.2e\n", worst_f, worst_b);
}

TEST(ChunkedP5, ChunkSizeInvarianceDouble) {
  const uint64_t seed = test_seed(5);
  double worst_f = 0, worst_b = 0, worst_rec_f = 0, worst_rec_b = 0;
  for (auto [v, a] : all_variants()) {
    for (bool varlen : {false, true}) {
      auto s = spec_of(v, a, {varlen ? 1 : 2, 41, 2, 6, 5}, seed);
      if (varlen) s.seqlens = {17, 0, 24};
      const auto in = fixtures::generate(s);
      const auto cot = fixtures::generate_cotangents(in, seed, true);
      const auto f1 = chunked_forward(in, ChunkOptions{1});
      const auto b1 = chunked_backward(in, cot, ChunkOptions{1});
      const double erf = worst_outputs(f1, recurrent_forward(in));
      const double erb = worst_grads(b1, recurrent_backward(in, cot));
      worst_rec_f = std::max(worst_rec_f, erf);
      worst_rec_b = std::max(worst_rec_b, erb);
      EXPECT_LT(erf, 1e-13) << name_of(v, a) << " C=1 vs recurrent; " << replay(seed);
      EXPECT_LT(erb, 1e-11) << name_of(v, a) << " C=1 vs recurrent (grads); " << replay(seed);
      for (int64_t C : {2, 7, 16, 41, 50}) {
        std::string wb;
        const double ef = worst_outputs(chunked_forward(in, ChunkOptions{C}), f1);
        const double eb = worst_grads(chunked_backward(in, cot, ChunkOptions{C}), b1, &wb);
        worst_f = std::max(worst_f, ef);
        worst_b = std::max(worst_b, eb);
        EXPECT_LT(ef, 1e-13) << name_of(v, a) << " C=" << C << " varlen=" << varlen << "; "
                             << replay(seed);
        EXPECT_LT(eb, 1e-11) << name_of(v, a) << " C=" << C << " varlen=" << varlen << " worst "
                             << wb << "; " << replay(seed);
      }
    }
  }
  std::printf("P5 double: C vs C=1 forward %.2e backward %.2e; C=1 vs recurrent %.2e / %.2e\n",
              worst_f, worst_b, worst_rec_f, worst_rec_b);
}

TEST(ChunkedP14, ChunkIdentitiesDouble) {
  using Mat = Eigen::MatrixXd;
  const uint64_t seed = test_seed(14);
  double worst = 0;
  for (auto [v, a] : all_variants()) {
    const auto in = fixtures::generate(spec_of(v, a, {1, 20, 1, 6, 5}, seed));
    const LaneView<double> Lv = lanes_of(in)[0];
    const int64_t t0 = 5, n = 9, K = 6;
    const Chunk<double> ch = build_chunk(Lv, t0, n, ChunkOptions{n});
    // Step transitions (I - k a^T) D of the chunk's tokens, and D alone.
    std::vector<Mat> step(n), Dm(n);
    std::vector<Eigen::VectorXd> av(n), kv(n);
    for (int64_t r = 0; r < n; ++r) {
      av[r] = Eigen::Map<const Eigen::VectorXd>(ch.a.data() + r * K, K);
      kv[r] = Eigen::Map<const Eigen::VectorXd>(ch.k.data() + r * K, K);
      Dm[r] = Mat::Zero(K, K);
      for (int64_t c = 0; c < K; ++c) Dm[r](c, c) = std::exp(Lv.g(t0 + r, c));
      step[r] = (Mat::Identity(K, K) - kv[r] * av[r].transpose()) * Dm[r];
    }
    // phi(i0, i1): product of the transitions of tokens i0..i1-1, later ones on the left.
    auto phi = [&](int64_t i0, int64_t i1) {
      Mat P = Mat::Identity(K, K);
      for (int64_t i = i0; i < i1; ++i) P = step[i] * P;
      return P;
    };
    auto rel = [](const Mat& x, const Mat& y) {
      return (x - y).cwiseAbs().maxCoeff() / std::max(1e-300, y.cwiseAbs().maxCoeff());
    };
    Mat Kh(n, K), Wa(n, K), L(n, n);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < K; ++c) {
        Kh(r, c) = ch.Kh[r * K + c];
        Wa(r, c) = ch.Wa[r * K + c];
      }
      for (int64_t j = 0; j < n; ++j) L(r, j) = ch.L[r * n + j];
    }
    Mat gl = Mat::Zero(K, K);
    for (int64_t c = 0; c < K; ++c) gl(c, c) = ch.gam[(n - 1) * K + c];
    const double e_trans = rel(gl - Kh.transpose() * Wa, phi(0, n));
    Mat Lref = Mat::Identity(n, n), Waref(n, K);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t j = 0; j < r; ++j)
        Lref(r, j) = -(av[r].transpose() * Dm[r] * phi(j + 1, r) * kv[j])(0, 0);
      Waref.row(r) = av[r].transpose() * Dm[r] * phi(0, r);
    }
    const double e_L = rel(L, Lref), e_Wa = rel(Wa, Waref);
    worst = std::max({worst, e_trans, e_L, e_Wa});
    EXPECT_LT(e_trans, 1e-13) << name_of(v, a) << " chunk transition; " << replay(seed);
    EXPECT_LT(e_L, 1e-13) << name_of(v, a) << " L_rj; " << replay(seed);
    EXPECT_LT(e_Wa, 1e-13) << name_of(v, a) << " rows of W_a; " << replay(seed);
  }
  std::printf("P14 double: worst %.2e\n", worst);
}

TEST(ChunkedP1P2, PrefixAndStatePassingOffChunkBoundaries) {
  const uint64_t seed = test_seed(12);
  const int64_t C = 7, T = 41;
  double worst = 0;
  for (auto [v, a] : all_variants()) {
    const auto in = fixtures::generate(spec_of(v, a, {2, T, 2, 6, 5}, seed));
    const Dims& d = in.dims;
    std::vector<double> states;
    const auto full = chunked_forward(in, ChunkOptions{C}, &states);
    // P1: a prefix run gives the prefix of the outputs.
    for (int64_t Tp : {1, 13, 20, 40}) {
      const auto pre = chunked_forward(slice_time(in, 0, Tp), ChunkOptions{C});
      const double e = rel_max(pre.o, slice_rows(full.o, d, d.V, 0, Tp));
      worst = std::max(worst, e);
      EXPECT_LT(e, 1e-13) << name_of(v, a) << " P1 T'=" << Tp << "; " << replay(seed);
    }
    // Chunk-start states equal the recurrent state after n C tokens.
    const int64_t N = chunk_count(T, C), KV = d.K * d.V;
    ASSERT_EQ(states.size(), static_cast<size_t>(d.B * N * d.H * KV));
    for (int64_t n = 0; n < N; ++n) {
      const auto ref = recurrent_forward(slice_time(in, 0, n * C)).ht;
      for (int64_t b = 0; b < d.B; ++b) {
        std::vector<double> got(states.begin() + (b * N + n) * d.H * KV,
                                states.begin() + (b * N + n + 1) * d.H * KV);
        std::vector<double> want(ref.begin() + b * d.H * KV, ref.begin() + (b + 1) * d.H * KV);
        const double e = rel_max(got, want);
        worst = std::max(worst, e);
        EXPECT_LT(e, 1e-13) << name_of(v, a) << " chunk state " << n << " seq " << b;
      }
    }
    // P2: split at tau, pass the state across.
    for (int64_t tau : {5, 13, 20}) {
      const auto first = chunked_forward(slice_time(in, 0, tau), ChunkOptions{C});
      auto rest = slice_time(in, tau, T);
      rest.h0 = first.ht;
      const auto second = chunked_forward(rest, ChunkOptions{C});
      const double e = std::max({rel_max(first.o, slice_rows(full.o, d, d.V, 0, tau)),
                                 rel_max(second.o, slice_rows(full.o, d, d.V, tau, T)),
                                 rel_max(second.ht, full.ht)});
      worst = std::max(worst, e);
      EXPECT_LT(e, 1e-13) << name_of(v, a) << " P2 tau=" << tau << "; " << replay(seed);
    }
  }
  std::printf("P1/P2 double (C=7): worst %.2e\n", worst);
}

TEST(ChunkedFactored, ExactWhereNoOverflowDouble) {
  const uint64_t seed = test_seed(46);
  double worst_f = 0, worst_b = 0;
  for (auto [v, a] : all_variants()) {
    const auto in = fixtures::generate(spec_of(v, a, {1, 41, 2, 6, 5}, seed));
    const auto cot = fixtures::generate_cotangents(in, seed, true);
    for (int64_t C : {7, 16}) {
      ChunkOptions fo{C};
      fo.factored = true;
      const double ef =
          worst_outputs(chunked_forward(in, fo), chunked_forward(in, ChunkOptions{C}));
      const double eb =
          worst_grads(chunked_backward(in, cot, fo), chunked_backward(in, cot, ChunkOptions{C}));
      worst_f = std::max(worst_f, ef);
      worst_b = std::max(worst_b, eb);
      EXPECT_LT(ef, 1e-12) << name_of(v, a) << " C=" << C << "; " << replay(seed);
      EXPECT_LT(eb, 1e-10) << name_of(v, a) << " C=" << C << "; " << replay(seed);
    }
  }
  std::printf("factored vs pairwise, double: forward %.2e backward %.2e\n", worst_f, worst_b);
}

// The P15 and P5 checks above must reject a chunked forward that forgets Q̃ S in (4.4).
TEST(ChunkedMutation, ForgottenCrossChunkTermIsCaught) {
  const uint64_t seed = test_seed(99);
  const std::vector<int64_t> Cs = {1, 2, 7, 16, 64, 13, 20};
  set_mpfr_bits(256);
  for (auto [v, a] : {std::pair{Variant::gdn2, Arm::none}, std::pair{Variant::qed, Arm::full}}) {
    for (const auto& ind : p15_cases(v, a, seed)) {
      const auto in = convert_inputs<mpfr_float>(ind);
      EXPECT_LT(p15_forward(in, correct_forward<mpfr_float>, Cs), 1e-60) << name_of(v, a);
      const double e15 = p15_forward(in, forward_without_cross_chunk_term<mpfr_float>, Cs);
      EXPECT_GT(e15, 1e-3) << name_of(v, a) << ": P15 missed the mutant; " << replay(seed);
      const double e5 = p5_forward(ind, forward_without_cross_chunk_term<double>, Cs);
      EXPECT_GT(e5, 1e-3) << name_of(v, a) << ": P5 missed the mutant; " << replay(seed);
      std::printf("mutant %s: P15 residual %.2e, P5 residual %.2e\n", name_of(v, a).c_str(), e15,
                  e5);
    }
  }
}
