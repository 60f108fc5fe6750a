// Self-attention for float32 on AVX-512 CPUs, on packed rows (varlen_attention) and on padded
// rows whose keys are one run per sequence (padded_attention): clearformer's own kernel.
//
// PyTorch's CPU flash-attention kernel computes its products with the BLAS library's sgemm,
// which on AMD processors runs MKL's AVX2 code: at MiniLM's shapes (32-wide heads, 8 to 256
// tokens) it reached 6-68 GFLOP/s against oneDNN's 215 for the linear layers on the same core
// (docs/performance.md, "Attention on AMD processors"). Here every (sequence, head) pair is
// one task: its keys are transposed once into a (Dh, T) buffer (16 x 16 blocks in registers),
// then eight queries at a time (four for a last block of four or fewer) get their scores 32
// keys at a time in sixteen AVX-512 accumulators, a softmax with a vectorised exponential, and
// the weighted sum of the values (read in place) 32 columns at a time in sixteen more. While
// one head computes, the next head's rows are prefetched (prefetch_rows), and so is the next
// sequence's whole block of rows, spread over the current sequence's heads (prefetch_block).
// The order of every sum is fixed by the task alone, so the blocking and the threads' cuts
// never change a bit of the result. Exact semantics of softmax(q k^T * scale) v within each
// sequence; no other mask, no dropout, bias or gradient (the Python side sends every other
// call to PyTorch's kernels). Built by clearformer.fast.avx512 with the system's C++
// compiler, once per source and PyTorch version.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include "avx512_exp.h"
#include <initializer_list>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using clearformer_avx512::exp_nonpositive;

constexpr int64_t LANES = 16;  // one AVX-512 vector of float32
constexpr int ROWS = 8;        // queries per register block: 2 x 8 accumulators

struct Scratch {
  std::vector<float> kt, s, qs;
  Scratch(int64_t d, int64_t keys)
      : kt(d * padded(keys)), s(ROWS * padded(keys)), qs(ROWS * d) {}
  static int64_t padded(int64_t keys) { return (keys + LANES - 1) / LANES * LANES; }
};

// Transposes a 16 x 16 block in registers: r[i] holds row i on entry, column i on return.
// Three rounds of shuffles (pairs within 128-bit lanes, quads, then whole lanes): 64 shuffles
// where a scalar transposition made 256 single-float stores.
inline void transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);  // columns 0, 1 | 4, 5 | 8, 9 | 12, 13
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);  // columns 2, 3 | 6, 7 | ...
  }
  for (int i = 0; i < 16; i += 4) {  // u[i + c]: column c, c + 4, c + 8, c + 12 of rows i..i+3
    u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {  // gather lane l of u[c], u[4 + c], u[8 + c], u[12 + c]
    const __m512 a = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);   // lanes 0, 2 | 0, 2
    const __m512 b = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);   // lanes 1, 3 | 1, 3
    const __m512 e = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
    const __m512 f = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
    r[c] = _mm512_shuffle_f32x4(a, e, 0x88);       // column c
    r[c + 8] = _mm512_shuffle_f32x4(a, e, 0xDD);   // column c + 8
    r[c + 4] = _mm512_shuffle_f32x4(b, f, 0x88);   // column c + 4
    r[c + 12] = _mm512_shuffle_f32x4(b, f, 0xDD);  // column c + 12
  }
}

// Queries i0 .. i0 + rows - 1 (rows <= R) of one head against its keys, transposed in kt
// (d, Tp), R rows at a time in registers: 2R accumulators for the scores and for the values.
// Spare rows repeat the last real one and are not stored. Each row's sums run in the same order
// whatever R, so the block size never changes a bit of the result.
template <int R>
void attend_block(const float* q, const float* v, float* out, int64_t i0, int rows, int64_t Tk,
                  int64_t d, int64_t in_stride, int64_t out_stride, __m512 vscale,
                  const float* kt, float* s, float* qs) {
  const int64_t Tp = Scratch::padded(Tk);
  const __mmask16 tail = static_cast<__mmask16>((1u << (Tk - (Tp - LANES))) - 1u);
  for (int r = 0; r < R; ++r) {
    const int64_t i = i0 + std::min(r, rows - 1);  // spare rows repeat the last real one
    for (int64_t c = 0; c < d; c += LANES)
      _mm512_storeu_ps(qs + r * d + c,
                       _mm512_mul_ps(_mm512_loadu_ps(q + i * in_stride + c), vscale));
  }
  // Scores, 32 keys at a time for all R queries (2R accumulators: two key vectors per R
  // broadcasts keeps the loop on the FMA units rather than the load ports), then a last
  // block of 16 where Tp is an odd number of vectors.
  int64_t j0 = 0;
  for (; j0 + 2 * LANES <= Tp; j0 += 2 * LANES) {
    __m512 lo[R], hi[R];
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
    for (int64_t dd = 0; dd < d; ++dd) {
      const __m512 k0 = _mm512_loadu_ps(kt + dd * Tp + j0);
      const __m512 k1 = _mm512_loadu_ps(kt + dd * Tp + j0 + LANES);
      for (int r = 0; r < R; ++r) {
        const __m512 qv = _mm512_set1_ps(qs[r * d + dd]);
        lo[r] = _mm512_fmadd_ps(qv, k0, lo[r]);
        hi[r] = _mm512_fmadd_ps(qv, k1, hi[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      _mm512_storeu_ps(s + r * Tp + j0, lo[r]);
      _mm512_storeu_ps(s + r * Tp + j0 + LANES, hi[r]);
    }
  }
  if (j0 < Tp) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t dd = 0; dd < d; ++dd) {
      const __m512 kv = _mm512_loadu_ps(kt + dd * Tp + j0);
      for (int r = 0; r < R; ++r)
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(qs[r * d + dd]), kv, acc[r]);
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(s + r * Tp + j0, acc[r]);
  }
  // Softmax numerators over the Tk real keys; the padded lanes are set to zero.
  float inv[R];
  for (int r = 0; r < rows; ++r) {
    float* sr = s + r * Tp;
    __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t j0 = 0; j0 + LANES < Tp; j0 += LANES)
      m = _mm512_max_ps(m, _mm512_loadu_ps(sr + j0));
    m = _mm512_mask_max_ps(m, tail, m, _mm512_loadu_ps(sr + Tp - LANES));
    const __m512 vmax = _mm512_set1_ps(_mm512_reduce_max_ps(m));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j0 = 0; j0 < Tp; j0 += LANES) {
      __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(sr + j0), vmax));
      if (j0 + LANES == Tp) e = _mm512_maskz_mov_ps(tail, e);
      _mm512_storeu_ps(sr + j0, e);
      sum = _mm512_add_ps(sum, e);
    }
    inv[r] = 1.0f / _mm512_reduce_add_ps(sum);
  }
  // Weighted sum of the values, 32 columns at a time (2R accumulators, as for the scores),
  // then 16 where d is an odd number of vectors; normalised at the end.
  int64_t c0 = 0;
  for (; c0 + 2 * LANES <= d; c0 += 2 * LANES) {
    __m512 lo[R], hi[R];
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
    for (int64_t j = 0; j < Tk; ++j) {
      const __m512 v0 = _mm512_loadu_ps(v + j * in_stride + c0);
      const __m512 v1 = _mm512_loadu_ps(v + j * in_stride + c0 + LANES);
      for (int r = 0; r < R; ++r) {
        const __m512 p = _mm512_set1_ps(s[r * Tp + j]);
        lo[r] = _mm512_fmadd_ps(p, v0, lo[r]);
        hi[r] = _mm512_fmadd_ps(p, v1, hi[r]);
      }
    }
    for (int r = 0; r < rows; ++r) {
      const __m512 norm = _mm512_set1_ps(inv[r]);
      _mm512_storeu_ps(out + (i0 + r) * out_stride + c0, _mm512_mul_ps(lo[r], norm));
      _mm512_storeu_ps(out + (i0 + r) * out_stride + c0 + LANES, _mm512_mul_ps(hi[r], norm));
    }
  }
  if (c0 < d) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t j = 0; j < Tk; ++j) {
      const __m512 vv = _mm512_loadu_ps(v + j * in_stride + c0);
      for (int r = 0; r < R; ++r)
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(s[r * Tp + j]), vv, acc[r]);
    }
    for (int r = 0; r < rows; ++r)
      _mm512_storeu_ps(out + (i0 + r) * out_stride + c0,
                       _mm512_mul_ps(acc[r], _mm512_set1_ps(inv[r])));
  }
}

// One head: Tq query rows attend Tk key rows (rows `in_stride` floats apart in q, k and v,
// `out_stride` apart in out), d (a multiple of 16) wide.
void attend_head(const float* q, const float* k, const float* v, float* out, int64_t Tq,
                 int64_t Tk, int64_t d, int64_t in_stride, int64_t out_stride, float scale,
                 Scratch& w) {
  const int64_t Tp = Scratch::padded(Tk);
  float* kt = w.kt.data();  // (d, Tp): keys transposed, zero past Tk
  float* s = w.s.data();    // (ROWS, Tp)
  float* qs = w.qs.data();  // (ROWS, d), scaled
  // The keys, transposed 16 x 16 at a time in registers; rows past Tk are zeros.
  for (int64_t j0 = 0; j0 < Tp; j0 += LANES) {
    const int64_t keys = std::min<int64_t>(LANES, Tk - j0);
    for (int64_t c0 = 0; c0 < d; c0 += LANES) {
      __m512 block[16];
      for (int64_t j = 0; j < LANES; ++j)
        block[j] = j < keys ? _mm512_loadu_ps(k + (j0 + j) * in_stride + c0) : _mm512_setzero_ps();
      transpose16(block);
      for (int64_t c = 0; c < LANES; ++c) _mm512_storeu_ps(kt + (c0 + c) * Tp + j0, block[c]);
    }
  }
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t i0 = 0; i0 < Tq; i0 += ROWS) {
    // The last block of a head takes half as many registers' rows when half suffice.
    const int rows = static_cast<int>(std::min<int64_t>(ROWS, Tq - i0));
    if (rows > ROWS / 2)
      attend_block<ROWS>(q, v, out, i0, rows, Tk, d, in_stride, out_stride, vscale, kt, s, qs);
    else
      attend_block<ROWS / 2>(q, v, out, i0, rows, Tk, d, in_stride, out_stride, vscale, kt, s,
                             qs);
  }
}

// Asks for `rows` rows (`stride` floats apart, d wide) to be brought into cache. The rows of
// one head are a fused QKV row apart (kilobytes: past what the hardware prefetchers follow),
// so each is a demand miss when first read; asking for the next head's rows while this one
// computes hides those misses.
inline void prefetch_rows(const float* p, int64_t rows, int64_t d, int64_t stride) {
  for (int64_t j = 0; j < rows; ++j)
    for (int64_t c = 0; c < d; c += LANES)
      _mm_prefetch(reinterpret_cast<const char*>(p + j * stride + c), _MM_HINT_T0);
}

// The largest block of rows prefetch_block asks for: a third of a 1 MB L2, so that the next
// sequence's rows do not push out the current one's.
constexpr int64_t BLOCK_PREFETCH_BYTES = 384 * 1024;

// Asks for part `part` of `parts` of a block of `rows` rows (`stride` floats apart) to be
// brought into L2. A packed sequence's q, k and v rows are one contiguous block, and each of
// its heads is called in turn: spreading the next sequence's block over the current one's heads
// brings it in while they compute. prefetch_rows alone, one head ahead, left half of the time
// of short sequences on an AMD EPYC (Zen 4) waiting for their rows (1.8 us per head with the
// rows in cache, 3.4-3.7 out of it); all of a block asked for at once fared worse than spread
// (docs/performance.md, "On an AMD EPYC machine (Zen 4)").
inline void prefetch_block(const float* p, int64_t rows, int64_t stride, int64_t part,
                           int64_t parts) {
  const int64_t lines = (rows * stride * static_cast<int64_t>(sizeof(float)) + 63) / 64;
  if (lines * 64 > BLOCK_PREFETCH_BYTES) return;  // long sequences: prefetch_rows suffices
  const char* c = reinterpret_cast<const char*>(p);
  const int64_t first = lines * part / parts, last = lines * (part + 1) / parts;
  for (int64_t line = first; line < last; ++line) _mm_prefetch(c + line * 64, _MM_HINT_T1);
}

// Runs task(item, scratch) for every item in [0, B * H): item b * H + h is sequence b's head h.
// Each thread takes one contiguous run of items (a sequence's heads share its rows in cache),
// cut where the runs' costs are equal: a head of a T-token sequence costs about T * (T + 16)
// (the products grow as T^2, the transposition and softmax set-up with T). Even runs of items,
// as parallel_for cuts them, gave one thread the long sequences of a ragged batch and left the
// other waiting. Each item is computed alone: the results do not depend on the cuts.
template <typename Task>
void run_balanced(int64_t B, int64_t H, int64_t d, int64_t keys, const int64_t* lengths,
                  const Task& task) {
  std::vector<double> cost(B + 1, 0.0);  // cost[b]: sequences 0 .. b-1, one head each
  for (int64_t b = 0; b < B; ++b)
    cost[b + 1] = cost[b] + static_cast<double>(lengths[b]) * (lengths[b] + 16);
  const int64_t items = B * H;
  const int64_t hands = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), items));
  // The cost of items [0, item), in units of one head: whole sequences, then the heads begun.
  auto cost_before = [&](int64_t item) {
    const int64_t b = item / H;
    return cost[b] * H + (b < B ? (cost[b + 1] - cost[b]) * (item % H) : 0.0);
  };
  const double total = cost_before(items);
  auto cut = [&](int64_t hand) {  // the first item of `hand`'s run
    if (hand >= hands) return items;
    int64_t lo = 0, hi = items;
    const double target = total * hand / hands;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (cost_before(mid) < target) lo = mid + 1; else hi = mid;
    }
    return lo;
  };
  at::parallel_for(0, hands, 1, [&](int64_t begin, int64_t end) {
    Scratch w(d, keys);
    for (int64_t hand = begin; hand < end; ++hand)
      for (int64_t item = cut(hand), last = cut(hand + 1); item < last; ++item) task(item, w);
  });
}

void check_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t dims) {
  TORCH_CHECK(q.dim() == dims && q.scalar_type() == at::kFloat && q.device().is_cpu(),
              "q must be float32 on the CPU with ", dims, " dimensions");
  TORCH_CHECK(k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
              "k and v must be float32");
  TORCH_CHECK(q.stride(-1) == 1 && k.stride(-1) == 1 && v.stride(-1) == 1,
              "the last dimension must be contiguous");
  TORCH_CHECK(k.sizes() == q.sizes() && v.sizes() == q.sizes(), "q, k, v shapes differ");
  TORCH_CHECK(q.strides() == k.strides() && q.strides() == v.strides(), "q, k, v strides differ");
  TORCH_CHECK(q.size(-1) % LANES == 0, "head width must be a multiple of 16");
}

// Packed rows: q, k, v (N, H, Dh); sequence b is rows cu_seqlens[b] .. cu_seqlens[b + 1] and
// attends only to itself. Returns (N, H, Dh).
at::Tensor varlen_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& cu_seqlens, double scale) {
  check_rows(q, k, v, 3);
  TORCH_CHECK(cu_seqlens.dim() == 1 && cu_seqlens.numel() >= 1, "cu_seqlens must be (B + 1,)");
  const int64_t N = q.size(0), H = q.size(1), d = q.size(2);
  auto out = at::empty({N, H, d}, q.options());
  auto cu = cu_seqlens.to(at::kLong).contiguous();
  const int64_t* bounds = cu.data_ptr<int64_t>();
  const int64_t B = cu.numel() - 1;
  TORCH_CHECK(bounds[0] == 0 && bounds[B] <= N, "cu_seqlens must start at 0 and end by N");
  int64_t longest = 0;
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(bounds[b + 1] >= bounds[b], "cu_seqlens must not decrease");
    longest = std::max(longest, bounds[b + 1] - bounds[b]);
  }
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t row_stride = q.stride(0), head_stride = q.stride(1);
  std::vector<int64_t> lengths(B);
  for (int64_t b = 0; b < B; ++b) lengths[b] = bounds[b + 1] - bounds[b];
  run_balanced(B, H, d, longest, lengths.data(), [&](int64_t item, Scratch& w) {
    const int64_t b = item / H, h = item % H;
    const int64_t start = bounds[b], T = lengths[b];
    if (T == 0) return;
    const int64_t off = start * row_stride + h * head_stride;
    // The next sequence's whole block, 1 / H of it per head of this one.
    if (b + 1 < B)
      prefetch_block(qp + bounds[b + 1] * row_stride, lengths[b + 1], row_stride, h, H);
    if (item + 1 < B * H) {  // the next head: this sequence's next, or the next one's first
      const int64_t nb = (item + 1) / H, nh = (item + 1) % H;
      const int64_t noff = bounds[nb] * row_stride + nh * head_stride;
      for (const float* p : {qp + noff, kp + noff, vp + noff})
        prefetch_rows(p, lengths[nb], d, row_stride);
    }
    attend_head(qp + off, kp + off, vp + off, op + start * H * d + h * d, T, T, d, row_stride,
                H * d, static_cast<float>(scale), w);
  });
  return out;
}

// Padded rows: q, k, v (B, T, H, Dh); all T queries of sequence b attend its keys
// key_start[b] .. key_start[b] + key_count[b] (at least one). Returns (B, T, H, Dh).
at::Tensor padded_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& key_start, const at::Tensor& key_count,
                            double scale) {
  check_rows(q, k, v, 4);
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), d = q.size(3);
  TORCH_CHECK(key_start.numel() == B && key_count.numel() == B,
              "key_start and key_count must hold one entry per sequence");
  auto starts = key_start.to(at::kLong).contiguous();
  auto counts = key_count.to(at::kLong).contiguous();
  const int64_t* first = starts.data_ptr<int64_t>();
  const int64_t* count = counts.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(count[b] >= 1 && first[b] >= 0 && first[b] + count[b] <= T,
                "sequence ", b, ": keys ", first[b], " + ", count[b], " outside 1..", T);
  auto out = at::empty({B, T, H, d}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t batch_stride = q.stride(0), row_stride = q.stride(1), head_stride = q.stride(2);
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    Scratch w(d, T);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / H, h = item % H;
      const int64_t base = b * batch_stride + h * head_stride;
      const int64_t keys = base + first[b] * row_stride;
      if (item + 1 < end) {  // the next head's queries, keys and values (see prefetch_rows)
        const int64_t nb = (item + 1) / H, nh = (item + 1) % H;
        const int64_t nbase = nb * batch_stride + nh * head_stride;
        const int64_t nkeys = nbase + first[nb] * row_stride;
        prefetch_rows(qp + nbase, T, d, row_stride);
        prefetch_rows(kp + nkeys, count[nb], d, row_stride);
        prefetch_rows(vp + nkeys, count[nb], d, row_stride);
      }
      attend_head(qp + base, kp + keys, vp + keys, op + (b * T * H + h) * d, T, count[b], d,
                  row_stride, H * d, static_cast<float>(scale), w);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(clearformer_avx512, m) {
  m.def("varlen_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, float scale) -> Tensor");
  m.def(
      "padded_attention(Tensor q, Tensor k, Tensor v, Tensor key_start, Tensor key_count, "
      "float scale) -> Tensor");
}
TORCH_LIBRARY_IMPL(clearformer_avx512, CPU, m) {
  m.impl("varlen_attention", &varlen_attention);
  m.impl("padded_attention", &padded_attention);
}
