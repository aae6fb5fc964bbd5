// Host side of the chunked forward (kernels/chunked_api.hpp): argument checks, the workspace
// (chunk bases of packed sequences, one ready flag and one fragment blob per chunk and head), the
// choice of the value-tile width, and the two launches (chunk-parallel prep, sequential state
// pass): one after the other, or overlapped where the state pass has few blocks (choose_plan).
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "kernels/chunked_api.hpp"
#include "kernels/chunked_common.cuh"

namespace qed::kernels {
namespace {

using chunked::Args;
using chunked::Mode;

Status bad(const std::string& msg) {
  return {StatusCode::invalid_argument, "chunked_forward: " + msg};
}
Status unsupported(const std::string& msg) {
  return {StatusCode::unsupported, "chunked_forward: " + msg};
}
Status cuda_fail(const char* what, cudaError_t e) {
  return {StatusCode::cuda_error, std::string("chunked_forward: ") + what + ": " + cudaGetErrorString(e)};
}

chunked::Seq seq_of(const SeqTensor& t) {
  return {t.data, t.stride_b, t.stride_t, t.stride_h, static_cast<int>(t.dtype)};
}

// Testing hook: QEDCHECK_CHUNKED_MUTANT=single (one bf16 term on the state path, the accuracy
// of a plain bf16 kernel), =nofallback (no element-wise path for steep decays), =bulkload (the
// state pass's bulk-copy loads leave out the chunk decay), =nowait (the overlapped state pass
// reads the blobs without waiting for them) or =splitparity (the state pass's read-out warps, where
// the overlapped bf16 forward runs them, read the other chunk's copies of Sᵀ and Uᵀ). Used
// by the GPU tests to show that their accuracy, extreme-decay and load-path checks fail on such
// kernels.
const char* mutant() {
  const char* m = std::getenv("QEDCHECK_CHUNKED_MUTANT");
  return m ? m : "";
}

Mode mode_of(const ChunkedForwardParams& p) {
  if (p.in.q.dtype == DType::fp32) return Mode::fp32;
  return std::strcmp(mutant(), "single") == 0 ? Mode::bf16_single : Mode::bf16;
}

int64_t chunk_bound(const Problem& pr) {
  const int64_t per = (pr.T + chunked::kC - 1) / chunked::kC;
  return pr.cu_seqlens ? per + pr.sequences() : pr.B * per;
}

// How the state pass runs: its value-tile width 16*MT, and whether it overlaps the prep pass.
struct StatePlan {
  int mt = 1;
  bool overlap = false;
  int64_t blocks = 0;  // of the state pass: sequences x heads x value tiles
  int warps = 0;       // the state pass's warps where the plan chose them (0: state_warps()'s rule)
};

// Overlapped (Args::ready): where the narrowest tile (16 columns) leaves at most one walking
// block per two multiprocessors, the state pass starts with the prep pass and walks the chunks as
// their blobs appear, instead of after all of them: at [1,65536,8,128] (64 blocks) on an H100 the
// forward takes 2.73-2.78 ms against 3.35-3.36 in series (reports/device/chunked.md run 21).
// Wider tiles are not overlapped: at [2,16384,16,128] the overlapped forward took 2.83 ms at
// 32 columns and 3.04-3.11 at 64, against 1.94 in series (the prep pass, left fewer blocks,
// becomes the longer one). Otherwise the widest tile that still gives enough blocks to fill the
// machine (wider tiles re-read the workspace fewer times): about two four-warp blocks per
// multiprocessor (at 16 and 32 columns two fit; at 64 columns only one does, by shared memory, so
// the 256 blocks at [8,4096,16,128] ran in two waves: run 34). Measured on an H200 (runs 7 and
// 9), four warps, passes in series: [8,4096,16,128] best at MT=4 (0.604 ms against 0.815 at
// MT=2), [2,16384,16,128] at MT=1 (0.718 against 0.768), [1,65536,8,128] at MT=1; and the
// 128-column tile on eight warps where it fills the machine (below). QEDCHECK_CHUNKED_MT (1, 2,
// 4; 8 for bf16 at K = 128) and
// QEDCHECK_CHUNKED_OVERLAP=0|1 override (1: overlap at any tile width and block count).
StatePlan choose_plan(const ChunkedForwardParams& p, Mode m) {
  const Problem& pr = p.problem;
  const int64_t lanes = pr.sequences() * pr.H;
  const int64_t vt16 = pr.V / 16;
  const int max_mt = m == Mode::fp32 ? 2 : 4;
  const char* ov = std::getenv("QEDCHECK_CHUNKED_OVERLAP");
  const bool ov_off = ov && std::strcmp(ov, "0") == 0, ov_on = ov && std::strcmp(ov, "1") == 0;
  const int64_t sms = chunked::num_sms();
  // at most one walking block per two multiprocessors at the 16-column tile
  const bool few = 2 * lanes * vt16 <= sms;
  StatePlan plan;
  auto with_blocks = [&](StatePlan pl) {
    pl.blocks = lanes * (vt16 / pl.mt);
    return pl;
  };
  // The 128-column tile: bf16, K = 128, eight warps (the one instance built for it, below).
  const bool wide_ok = m == Mode::bf16 && pr.K == 128 && vt16 % 8 == 0;
  auto wide = [&]() {
    StatePlan pl;
    pl.mt = 8;
    pl.warps = 8;
    return with_blocks(pl);
  };
  if (const char* e = std::getenv("QEDCHECK_CHUNKED_MT")) {
    const int mt = std::atoi(e);
    if (mt == 8 && wide_ok) return wide();
    if ((mt == 1 || mt == 2 || mt == 4) && mt <= max_mt && vt16 % mt == 0) {
      plan.mt = mt;
      plan.overlap = ov_on || (!ov_off && mt == 1 && few);
      return with_blocks(plan);
    }
  }
  if (ov_on || (!ov_off && few)) return with_blocks({1, true});
  // Blocks wanted, in eighths of a multiprocessor: 14/8 for four warps with bulk loads (K = 128),
  // 7/8 otherwise (eight warps, and K = 64 as measured before).
  const bool four = pr.K == 128 && chunked::state_warps(128) == 4;  // not overlapped here
  auto widest = [&](int64_t want) {
    for (int mt = max_mt; mt > 1; mt /= 2)
      if (vt16 % mt == 0 && 8 * lanes * (vt16 / mt) >= want) return mt;
    return 1;
  };
  // The 128-column tile on eight warps (bf16, K = 128, the warps not forced) wherever it still
  // gives about one block a multiprocessor (7/8): every chunk's blob is then read once per
  // (sequence, head) instead of once per 64-column tile. The four-warp pass at 64 columns ran at
  // 88% of the DRAM bandwidth (ncu, [8,4096,16,128] on an H100, L2 hit rate 15%: the second tile's
  // reads of a blob do not find it in L2); the 128-column pass reads half as much and is bitwise
  // the same (one accumulator set in both). Measured in one call (reports/device/chunked.md run
  // 34): state pass 0.525 against 0.630 ms, whole forward 1.661 against 1.776.
  if (four && wide_ok && !std::getenv("QEDCHECK_CHUNKED_STATE_WARPS") && 8 * lanes * (vt16 / 8) >= 7 * sms)
    return wide();
  plan.mt = widest((four ? 14 : 7) * sms);
  // Where four warps would walk one 16-column tile but eight warps fill the machine with a wider
  // one (bf16 inputs, K = 128, the warps not forced), the wider tile on eight warps with cp.async:
  // it reads the blob's shared part half as often. At [2,16384,16,128] (32 lanes) on an H100 the
  // whole forward took 1.846 ms against 1.948 (reports/device/chunked.md run 32, one call), on
  // the H200 1.772 against 1.781 (run 9).
  if (four && m == Mode::bf16 && plan.mt == 1 && !std::getenv("QEDCHECK_CHUNKED_STATE_WARPS")) {
    const int mt8 = widest(7 * sms);
    if (mt8 > 1) {
      plan.mt = mt8;
      plan.warps = 8;
    }
  }
  return with_blocks(plan);
}

Status check(const ChunkedForwardParams& p) {
  const char* fn = "chunked_forward";
  const Problem& pr = p.problem;
  if (Status s = validate_problem(fn, pr); !s.ok()) return s;
  if (Status s = validate_inputs(fn, pr, p.in); !s.ok()) return s;
  if (Status s = validate_output(fn, "o", pr, p.o); !s.ok()) return s;
  if (p.ht.data)
    if (Status s = validate_state(fn, "ht", p.ht); !s.ok()) return s;
  if (p.chunk_states.data)
    if (Status s = validate_state(fn, "chunk_states", p.chunk_states); !s.ok()) return s;
  if (Status s = chunked::check_built_sizes(fn, pr, p.in.q.dtype); !s.ok()) return s;
  const DType dt = p.in.q.dtype;
  auto same = [&](const SeqTensor& t, const char* name) -> Status {
    if (t.data && t.dtype != dt)
      return bad(std::string(name) + " dtype " + to_string(t.dtype) + " differs from q dtype " +
                 to_string(dt) + " (q, k, v, b, w, beta share one dtype)");
    return {};
  };
  const std::pair<const SeqTensor*, const char*> others[] = {
      {&p.in.k, "k"}, {&p.in.v, "v"}, {&p.in.b, "b"}, {&p.in.w, "w"}, {&p.in.beta, "beta"}};
  for (const auto& [t, n] : others)
    if (Status s = same(*t, n); !s.ok()) return s;
  if (p.in.g.data && p.in.g.dtype != dt && p.in.g.dtype != DType::fp32)
    return bad(std::string("g dtype ") + to_string(p.in.g.dtype) + " must be fp32 or q's dtype");
  if (p.o.dtype != DType::bf16 && p.o.dtype != DType::fp32)
    return unsupported(std::string("o dtype ") + to_string(p.o.dtype) + " (bf16 or fp32 only)");
  return {};
}

Args make_args(const ChunkedForwardParams& p, Mode m) {
  const Problem& pr = p.problem;
  Args A;
  A.variant = static_cast<int>(pr.variant);
  A.arm = static_cast<int>(pr.arm);
  A.B = pr.B;
  A.T = pr.T;
  A.H = pr.H;
  A.K = pr.K;
  A.V = pr.V;
  A.N = pr.sequences();
  A.scale = pr.scale;
  A.cu = pr.cu_seqlens;
  A.chunks_per_seq = (pr.T + chunked::kC - 1) / chunked::kC;
  A.chunk_bound = chunk_bound(pr);
  A.q = seq_of(p.in.q);
  A.k = seq_of(p.in.k);
  A.v = seq_of(p.in.v);
  A.g = seq_of(p.in.g);
  A.b = seq_of(p.in.b);
  A.w = seq_of(p.in.w);
  A.beta = seq_of(p.in.beta);
  A.lambda = p.in.lambda;
  A.r = p.in.r;
  A.h0 = p.in.h0.data;
  A.h0_sn = p.in.h0.stride_n;
  A.h0_sh = p.in.h0.stride_h;
  A.h0_sk = p.in.h0.stride_k;
  A.o = p.o.data;
  A.o_sb = p.o.stride_b;
  A.o_st = p.o.stride_t;
  A.o_sh = p.o.stride_h;
  A.o_dt = static_cast<int>(p.o.dtype);
  A.ht = p.ht.data;
  A.ht_sn = p.ht.stride_n;
  A.ht_sh = p.ht.stride_h;
  A.ht_sk = p.ht.stride_k;
  A.cs = p.chunk_states.data;
  A.cs_sn = p.chunk_states.stride_n;
  A.cs_sh = p.chunk_states.stride_h;
  A.cs_sk = p.chunk_states.stride_k;
  A.blob = chunked::blob_bytes(static_cast<int>(pr.K), pr.V, m);
  const int elem = p.in.q.dtype == DType::fp32 ? 4 : 2;
  const bool chan_b = pr.variant == Variant::gdn2 || pr.variant == Variant::qed;
  using chunked::rows_aligned16;
  A.vec = rows_aligned16(p.in.q, elem) && rows_aligned16(p.in.k, elem) &&
          (!chan_b || rows_aligned16(p.in.b, elem));
  A.vec_g = p.in.g.data && p.in.g.dtype == p.in.q.dtype && rows_aligned16(p.in.g, elem);
  A.vec_vw = rows_aligned16(p.in.v, elem) && (!chan_b || rows_aligned16(p.in.w, elem));
  if (std::strcmp(mutant(), "nofallback") == 0) A.max_diag = 1e30f;
  if (std::strcmp(mutant(), "bulkload") == 0) A.load_mutant = 1;
  if (std::strcmp(mutant(), "nowait") == 0) A.ready_mutant = 1;
  if (std::strcmp(mutant(), "splitparity") == 0) A.split_mutant = 1;
  // Benchmark hook: QEDCHECK_CHUNKED_PREP_STOP=k (1..7) ends the prep pass after its phase k
  // (load, decay cumsum, QED prologue, T/M, L with K^/Q~, A~, v/w load; W_a/W_z is the rest), to
  // time the phases by difference. Its workspace output is then incomplete. On eight warps QED's
  // projection sums run beside the decay cumsum (phase 2), leaving phase 3 the steep channels.
  if (const char* e = std::getenv("QEDCHECK_CHUNKED_PREP_STOP")) A.prep_stop = std::atoi(e);
  return A;
}

size_t base_bytes(const Problem& pr) {
  return pr.cu_seqlens ? ((static_cast<size_t>(pr.sequences()) + 1) * 8 + 255) / 256 * 256 : 0;
}

}  // namespace

namespace chunked {
int num_sms() {
  static int n = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v > 0 ? v : 132;
  }();
  return n;
}

// Prep blocks of `ps` bytes of shared memory that one state block of `ss` bytes keeps off its
// multiprocessor (at least one). Before the SPLIT instance this was ceil(ss / ps), which gives
// the same for every instance measured then (ss at most ps: one).
static int64_t displaced_prep_blocks(int ps, int ss) {
  static const std::pair<int, int> sm = [] {
    int dev = 0, total = 0, rsv = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&total, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
    cudaDeviceGetAttribute(&rsv, cudaDevAttrReservedSharedMemoryPerBlock, dev);
    return std::make_pair(total > 0 ? total : 233472, rsv >= 0 ? rsv : 1024);
  }();
  const int64_t alone = sm.first / (ps + sm.second);
  const int64_t left = sm.first - (ss + sm.second);
  const int64_t beside = left > 0 ? left / (ps + sm.second) : 0;
  return alone - beside > 1 ? alone - beside : 1;
}

size_t ready_flag_bytes(const Problem& pr) {
  return (static_cast<size_t>(chunk_bound(pr)) * static_cast<size_t>(pr.H) * 4 + 255) / 256 * 256;
}

size_t forward_workspace_bytes(const Problem& pr, Mode m) {
  return base_bytes(pr) + ready_flag_bytes(pr) +
         static_cast<size_t>(chunk_bound(pr)) * static_cast<size_t>(pr.H) *
             static_cast<size_t>(blob_bytes(static_cast<int>(pr.K), pr.V, m));
}
}  // namespace chunked

Status chunked_forward_workspace(const ChunkedForwardParams& p, size_t* bytes) {
  if (Status s = check(p); !s.ok()) return s;
  *bytes = chunked::forward_workspace_bytes(p.problem, mode_of(p));
  return {};
}

namespace {

// The launch arguments of the forward in mode m over workspace ws (chunk bases first, then the
// blobs), with the backward's hooks where given.
Args args_for(const ChunkedForwardParams& p, Mode m, void* ws, const chunked::BwdHooks* hooks) {
  Args A = make_args(p, m);
  // workspace: chunk bases (varlen), the overlapped forward's flags, the blobs
  A.ws = static_cast<char*>(ws) + base_bytes(p.problem) + chunked::ready_flag_bytes(p.problem);
  if (hooks) {
    A.bws = hooks->bws;
    A.bblob = hooks->bblob;
    A.u_out = hooks->u_out;
  }
  if (p.problem.cu_seqlens) A.chunk_base = static_cast<const int64_t*>(ws);
  return A;
}

// The forward in mode m; with hooks (the chunked backward's recompute) the passes also write the
// backward's blobs and U, and `used` receives the launch arguments for the backward's passes.
Status run_forward(const ChunkedForwardParams& p, Mode m, const chunked::BwdHooks* hooks, Args* used) {
  if (Status s = device_status(); !s.ok()) return s;
  const Problem& pr = p.problem;
  const size_t need = chunked::forward_workspace_bytes(pr, m);
  const StatePlan plan = choose_plan(p, m);
  const int MT = plan.mt;
  cudaStream_t st = reinterpret_cast<cudaStream_t>(pr.stream);
  void* ws = p.workspace;
  bool owned = false;
  if (!ws) {
    if (cudaError_t e = cudaMallocAsync(&ws, need > 0 ? need : 256, st); e != cudaSuccess)
      return cuda_fail("workspace allocation", e);
    owned = true;
  } else if (p.workspace_bytes < need) {
    return bad("workspace_bytes = " + std::to_string(p.workspace_bytes) + " is smaller than the " +
               std::to_string(need) + " bytes chunked_forward_workspace asks for");
  } else if (reinterpret_cast<uintptr_t>(ws) % 256 != 0) {
    return bad("workspace must be 256-byte aligned");
  }
  Args A = args_for(p, m, ws, hooks);
  A.state_nw = plan.warps;
  Status result;
  cudaError_t e = cudaSuccess;
  if (pr.cu_seqlens) e = chunked::launch_chunk_base(A, static_cast<int64_t*>(ws), st);
  // Benchmark hook: QEDCHECK_CHUNKED_ONLY=prep|state launches one pass (the other pass's
  // workspace contents are whatever an earlier call left), to time the passes apart.
  const char* only = std::getenv("QEDCHECK_CHUNKED_ONLY");
  const bool do_prep = !only || std::strcmp(only, "state") != 0;
  const bool do_state = !only || std::strcmp(only, "prep") != 0;
  if (do_prep && plan.overlap) {
    A.ready = reinterpret_cast<unsigned*>(static_cast<char*>(ws) + base_bytes(pr));
    A.overlap_seq_major = pr.cu_seqlens ? 1 : 0;
    // the prep blocks a state block displaces from its multiprocessor (by shared memory: those
    // that fit alone less those that fit beside it; at least one)
    // (QEDCHECK_CHUNKED_OVERLAP_SLOTS=k: k times that, for the side-by-side timing)
    const int ps = chunked::prep_smem_bytes(static_cast<int>(pr.K), p.in.q.dtype == DType::fp32);
    const int ss = chunked::state_smem_bytes(static_cast<int>(pr.K), MT, m, true);
    int64_t per = chunked::displaced_prep_blocks(ps, ss);
    if (const char* e = std::getenv("QEDCHECK_CHUNKED_OVERLAP_SLOTS"); e && std::atoi(e) > 0) per *= std::atoi(e);
    A.prep_free_slots = plan.blocks * per;
    if (e == cudaSuccess) e = cudaMemsetAsync(A.ready, 0, chunked::ready_flag_bytes(pr), st);
  }
  if (e == cudaSuccess && do_prep)
    e = chunked::launch_prep(A, p.in.q.dtype == DType::fp32, m, A.chunk_bound, st);
  if (e == cudaSuccess && do_state) e = chunked::launch_state(A, m, MT, st);
  if (e != cudaSuccess) result = cuda_fail("kernel launch", e);
  if (owned) cudaFreeAsync(ws, st);
  if (used) *used = A;
  return result;
}

}  // namespace

Status chunked_forward(const ChunkedForwardParams& p) {
  if (Status s = check(p); !s.ok()) return s;
  return run_forward(p, mode_of(p), nullptr, nullptr);
}

Status chunked_forward_plan(const ChunkedForwardParams& p, ChunkedForwardPlan* out) {
  if (Status s = check(p); !s.ok()) return s;
  if (Status s = device_status(); !s.ok()) return s;
  const Mode m = mode_of(p);
  const StatePlan plan = choose_plan(p, m);
  const int K = static_cast<int>(p.problem.K);
  const bool split_ok = m == Mode::bf16 && plan.mt == 1;
  out->tile_columns = 16 * plan.mt;
  out->overlapped = plan.overlap;
  out->state_blocks = plan.blocks;
  out->walking_warps = plan.warps ? plan.warps : chunked::state_warps(K, plan.overlap, split_ok);
  out->read_out_warps = K == 128 && plan.overlap && split_ok && out->walking_warps == 4 &&
                                chunked::state_split()
                            ? 4
                            : 0;
  return {};
}

namespace chunked {
Status forward_for_backward(const ChunkedForwardParams& p, const BwdHooks& hooks, Args* used) {
  if (Status s = check(p); !s.ok()) return s;
  if (!p.workspace)
    return {StatusCode::invalid_argument, "chunked_forward: the backward's recompute needs a workspace"};
  return run_forward(p, Mode::bf16, &hooks, used);
}
Args recompute_args(const ChunkedForwardParams& p, const BwdHooks& hooks) {
  return args_for(p, Mode::bf16, p.workspace, &hooks);
}
}  // namespace chunked

}  // namespace qed::kernels
