// Zero-padding of the head dimensions (verify/head_padding.hpp), which lets the CUDA kernels run
// cases of head sizes they are not built for (the golden corpus' K = V = 4): running the padded
// problem and trimming the results back must give the original problem's outputs and gradients
// bit for bit in the CPU reference, for every variant and arm, with h0, dht and varlen. A mutant
// that leaves non-zero queries in the padded channels must be caught (QED's erase direction reads
// q, so the padded channels would leak into the original ones).
#include <gtest/gtest.h>

#include "properties/test_chunked_support.hpp"
#include "reference/chunked.hpp"
#include "reference/recurrent.hpp"
#include "verify/head_padding.hpp"

using namespace qed;
using namespace qed::reference;
using chunked_test::all_variants;
using chunked_test::name_of;
using verify::resize_heads;

namespace {

struct Problem {
  Inputs<double> in;
  Cotangents<double> cot;
};

Problem make(Variant v, Arm a, uint64_t seed) {
  fixtures::GenSpec s;
  s.variant = v;
  s.arm = a;
  s.dims = {1, 70, 2, 5, 3};  // K = 5, V = 3: sizes no kernel is built for
  s.seqlens = {30, 0, 40};
  s.with_h0 = true;
  s.unit_keys = false;
  s.seed = seed;
  Problem p{fixtures::generate(s), {}};
  p.cot = fixtures::generate_cotangents(p.in, seed, /*with_dht=*/true);
  return p;
}

struct Results {
  Outputs<double> out;
  Grads<double> grads;
};

Results run(const Problem& p, bool chunked) {
  ChunkOptions co;
  co.chunk = 16;
  if (chunked) return {chunked_forward(p.in, co, static_cast<std::vector<double>*>(nullptr), 1), chunked_backward(p.in, p.cot, co, 1)};
  return {recurrent_forward(p.in, 1), recurrent_backward(p.in, p.cot, 1)};
}

// The original problem's results versus the padded run trimmed back; the number of values that
// differ (0 when padding is exact).
enum class Leak { none, keys_and_queries, state_and_queries };

int64_t differing(const Problem& p, int64_t K2, int64_t V2, bool chunked, Leak leak = Leak::none) {
  const Results want = run(p, chunked);
  Problem padded{resize_heads(p.in, K2, V2), resize_heads(p.cot, p.in, K2, V2)};
  const int64_t K = p.in.dims.K;
  for (size_t i = 0; i < padded.in.k.size(); ++i) {
    if (static_cast<int64_t>(i) % K2 < K) continue;
    if (leak == Leak::keys_and_queries) padded.in.k[i] = 0.5;
    if (leak != Leak::none) padded.in.q[i] = 0.5;
  }
  if (leak == Leak::state_and_queries)
    for (size_t i = 0; i < padded.in.h0.size(); ++i)
      if (static_cast<int64_t>(i) / V2 % K2 >= K) padded.in.h0[i] = 0.25;
  const Results got_padded = run(padded, chunked);
  const Outputs<double> out = resize_heads(got_padded.out, padded.in, p.in.dims.K, p.in.dims.V);
  const Grads<double> grads = resize_heads(got_padded.grads, padded.in, p.in.dims.K, p.in.dims.V);
  int64_t n = 0;
  auto count = [&](const std::vector<double>& a, const std::vector<double>& b, const char* what) {
    EXPECT_EQ(a.size(), b.size()) << what;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) n += a[i] != b[i];
  };
  count(out.o, want.out.o, "o");
  count(out.ht, want.out.ht, "ht");
  for (const auto& [x, y, what] :
       {std::tuple{&grads.dq, &want.grads.dq, "dq"}, {&grads.dk, &want.grads.dk, "dk"},
        {&grads.dv, &want.grads.dv, "dv"}, {&grads.dg, &want.grads.dg, "dg"},
        {&grads.db, &want.grads.db, "db"}, {&grads.dw, &want.grads.dw, "dw"},
        {&grads.dbeta, &want.grads.dbeta, "dbeta"}, {&grads.dlambda, &want.grads.dlambda, "dlambda"},
        {&grads.dr, &want.grads.dr, "dr"}, {&grads.dh0, &want.grads.dh0, "dh0"}})
    count(*x, *y, what);
  return n;
}

}  // namespace

TEST(HeadPadding, ResizeRoundTripsAndZeroFills) {
  const Problem p = make(Variant::qed, Arm::rand, 3);
  const Inputs<double> big = resize_heads(p.in, 16, 8);
  EXPECT_EQ(big.q.size(), p.in.q.size() / 5 * 16);
  EXPECT_EQ(big.h0.size(), p.in.h0.size() / 15 * 128);
  EXPECT_EQ(big.r.size(), 2u * 16);
  EXPECT_EQ(big.q[5], 0.0);  // first row, first padded channel
  EXPECT_EQ(big.q[16], p.in.q[5]);  // second row starts with the original second row
  EXPECT_EQ(big.h0[8], p.in.h0[3]);  // state row 1, column 0
  EXPECT_EQ(big.h0[3], 0.0);         // state row 0, first padded column
  const Inputs<double> back = resize_heads(big, 5, 3);
  EXPECT_EQ(back.q, p.in.q);
  EXPECT_EQ(back.v, p.in.v);
  EXPECT_EQ(back.g, p.in.g);
  EXPECT_EQ(back.b, p.in.b);
  EXPECT_EQ(back.w, p.in.w);
  EXPECT_EQ(back.r, p.in.r);
  EXPECT_EQ(back.h0, p.in.h0);
  EXPECT_EQ(back.dims.K, 5);
}

TEST(HeadPadding, RecurrentReferenceBitwiseForEveryVariant) {
  for (auto [v, a] : all_variants()) {
    SCOPED_TRACE(name_of(v, a));
    const Problem p = make(v, a, 11);
    EXPECT_EQ(differing(p, 16, 4, false), 0);
    EXPECT_EQ(differing(p, 64, 64, false), 0);
  }
}

TEST(HeadPadding, ChunkedReferenceBitwiseForEveryVariant) {
  for (auto [v, a] : all_variants()) {
    SCOPED_TRACE(name_of(v, a));
    EXPECT_EQ(differing(make(v, a, 12), 64, 64, true), 0);
  }
}

// Mutation checks: padding that reaches the original channels changes their results.
TEST(HeadPadding, LeakingPaddingIsCaught) {
  for (auto [v, a] : all_variants()) {
    SCOPED_TRACE(name_of(v, a));
    const Problem p = make(v, a, 13);
    EXPECT_GT(differing(p, 16, 4, false, Leak::keys_and_queries), 0);
    EXPECT_GT(differing(p, 16, 4, false, Leak::state_and_queries), 0);
  }
}

TEST(HeadPadding, BuiltSizesOfTheCudaKernels) {
  using verify::built_head_sizes;
  EXPECT_EQ(built_head_sizes("cuda-recurrent", 4, 4).K, 16);
  EXPECT_EQ(built_head_sizes("cuda-recurrent", 4, 4).V, 4);
  EXPECT_EQ(built_head_sizes("cuda-recurrent", 33, 5).K, 64);
  EXPECT_EQ(built_head_sizes("cuda-recurrent", 33, 5).V, 8);
  EXPECT_EQ(built_head_sizes("cuda-recurrent", 300, 5000).K, 300);  // left for the kernel to reject
  EXPECT_EQ(built_head_sizes("cuda-recurrent", 300, 5000).V, 5000);
  EXPECT_EQ(built_head_sizes("cuda-chunked", 4, 100).K, 64);
  EXPECT_EQ(built_head_sizes("cuda-chunked", 4, 100).V, 128);
  EXPECT_EQ(built_head_sizes("reference-recurrent", 4, 4).K, 4);
}
