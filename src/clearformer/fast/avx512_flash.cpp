// Attention on float32 rows for AVX-512 CPUs: causal or bidirectional, local (a window) or
// global, grouped-query keys and values read in place of their query heads, any sequence length
// (flash-style: the scores of a block of keys at a time, never the whole (T, T) matrix). The
// float32 twin of avx512_flash_bf16.cpp, on plain FMAs: for CPUs without AVX512-BF16, and for
// float32 and int8 models (whose attention runs in float32).
//
// Why: PyTorch's CPU flash kernel computes its products with the BLAS library's sgemm, which on
// AMD processors runs MKL's AVX2 code, and it reads a grouped key/value head once per query
// head. At long inputs attention is half of a grouped-query model's work (Qwen3-Embedding at
// 8k tokens). Here:
//
// - scores: the keys of a sequence's key/value head are packed once into tiles of 16 keys by
//   head dimension (pack_keys), so one FMA gives 16 keys one dimension further; a query's
//   value at that dimension is one broadcast. Eight queries by 32 keys: 16 accumulators.
// - weighted values: the values of the sequence's key/value head are copied once into rows of
//   their own (pack_values, zero rows past the end); one FMA adds one key's contribution to 16
//   columns. Eight queries by 32 columns.
//
// Softmax is the online one (running maximum and sum per query, the output rescaled when the
// maximum grows); masked keys (causal, window, and the tail of a tile) get weight exactly 0,
// whatever their keys hold, so their finite values add exactly nothing (an infinite or NaN
// value of a later token of the same sequence poisons the sum, as in PyTorch's kernels); other
// sequences' rows are never read. One task is a block of QUERY_BLOCK queries of every query
// head that shares one key/value head, so a block of keys is read from cache by all of them;
// tasks are taken from a shared counter, costliest first, and each task's sums run in a fixed
// order, so the result does not depend on the thread count. Built with the other AVX-512
// kernels (clearformer.fast.avx512).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include "avx512_exp.h"
#include "avx512_flash_plan.h"
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using clearformer_avx512::exp_nonpositive;  // avx512_exp.h
// avx512_flash_plan.h: the blocking, the checks, the keys each query sees, the tasks.
using clearformer_flash::KEY_BLOCK;
using clearformer_flash::KEY_TILE;
using clearformer_flash::LANES;
using clearformer_flash::QUERY_BLOCK;
using clearformer_flash::ROWS;
using clearformer_flash::Task;

// Keys of one (sequence, key/value head): rows k[j * row_stride + 0 .. d) for j < T, packed as
// tiles of 16 keys: tile t, dimension c, lane l holds k[16t + l][c]. Keys from T up to Tp (a
// multiple of KEY_TILE) are zeros; their weights are 0 anyway.
void pack_keys(const float* k, int64_t T, int64_t Tp, int64_t d, int64_t row_stride, float* out) {
  for (int64_t t = 0; t < Tp / LANES; ++t) {
    float* tile = out + t * d * LANES;
    for (int64_t lane = 0; lane < LANES; ++lane) {
      const int64_t j = t * LANES + lane;
      const float* row = j < T ? k + j * row_stride : nullptr;
      for (int64_t c = 0; c < d; ++c) tile[c * LANES + lane] = row ? row[c] : 0.0f;
    }
  }
}

// Values of one (sequence, key/value head) as (Tp, d) rows; rows from T up to Tp are zeros.
void pack_values(const float* v, int64_t T, int64_t Tp, int64_t d, int64_t row_stride,
                 float* out) {
  for (int64_t j = 0; j < Tp; ++j) {
    if (j < T)
      std::memcpy(out + j * d, v + j * row_stride, d * sizeof(float));
    else
      std::memset(out + j * d, 0, d * sizeof(float));
  }
}

// The running state of one query head's block of queries.
struct BlockState {
  std::vector<float> out;      // (QUERY_BLOCK, d): the unnormalised weighted sum
  std::vector<float> maximum;  // (QUERY_BLOCK,): the largest score seen
  std::vector<float> total;    // (QUERY_BLOCK,): sum of exp(score - maximum)
  std::vector<float> query;    // (QUERY_BLOCK, d)
  void reset(int64_t d) {
    out.assign(QUERY_BLOCK * d, 0.0f);
    maximum.assign(QUERY_BLOCK, -std::numeric_limits<float>::infinity());
    total.assign(QUERY_BLOCK, 0.0f);
    query.assign(QUERY_BLOCK * d, 0.0f);
  }
};

// Scores of ROWS queries (q, (ROWS, d)) against KEY_TILE keys starting at packed tile `tiles`
// (two 16-key tiles): s[r][0 .. 32) = scale * q_r . k.
inline void scores_8x32(const float* q, const float* tiles, int64_t d, float scale, float* s,
                        int64_t s_stride) {
  __m512 acc[ROWS][2];
  for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const float* t0 = tiles;
  const float* t1 = tiles + d * LANES;
  for (int64_t c = 0; c < d; ++c) {
    const __m512 k0 = _mm512_loadu_ps(t0 + c * LANES);
    const __m512 k1 = _mm512_loadu_ps(t1 + c * LANES);
    for (int r = 0; r < ROWS; ++r) {
      const __m512 qb = _mm512_set1_ps(q[r * d + c]);
      acc[r][0] = _mm512_fmadd_ps(qb, k0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(qb, k1, acc[r][1]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int r = 0; r < ROWS; ++r) {
    _mm512_storeu_ps(s + r * s_stride, _mm512_mul_ps(acc[r][0], sc));
    _mm512_storeu_ps(s + r * s_stride + LANES, _mm512_mul_ps(acc[r][1], sc));
  }
}

// out[r][c0 .. c0 + 32) += sum over `keys` keys j of p[r][j] * values[j][c0 ..]: ROWS queries
// (p, (ROWS, p_stride)).
inline void weighted_8x32(const float* p, int64_t p_stride, const float* values, int64_t keys,
                          int64_t d, int64_t c0, float* out) {
  __m512 acc[ROWS][2];
  for (int r = 0; r < ROWS; ++r) {
    acc[r][0] = _mm512_loadu_ps(out + r * d + c0);
    acc[r][1] = _mm512_loadu_ps(out + r * d + c0 + LANES);
  }
  for (int64_t j = 0; j < keys; ++j) {
    const float* row = values + j * d + c0;
    const __m512 v0 = _mm512_loadu_ps(row);
    const __m512 v1 = _mm512_loadu_ps(row + LANES);
    for (int r = 0; r < ROWS; ++r) {
      const __m512 w = _mm512_set1_ps(p[r * p_stride + j]);
      acc[r][0] = _mm512_fmadd_ps(w, v0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(w, v1, acc[r][1]);
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    _mm512_storeu_ps(out + r * d + c0, acc[r][0]);
    _mm512_storeu_ps(out + r * d + c0 + LANES, acc[r][1]);
  }
}

struct Scratch {
  std::vector<float> s;  // (ROWS, KEY_BLOCK) scores, then their weights
  Scratch() : s(ROWS * KEY_BLOCK) {}
};

// One step of ROWS queries (rows first .. first + ROWS of the block, positions `position`
// onwards in their sequence) over the keys key0 .. key0 + block_keys of the packed K and V.
// `visible`: keys below it exist; `causal`: query at position i sees keys j <= i; `window`
// (>= 0): it sees keys j with |i - j| <= window only.
void step(BlockState& st, int64_t first, int64_t position, int64_t key0, int64_t block_keys,
          int64_t visible, bool causal, int64_t window, const float* keys, const float* values,
          int64_t d, float scale, Scratch& w) {
  const float* q = st.query.data() + first * d;
  for (int64_t t = 0; t < block_keys; t += KEY_TILE)
    scores_8x32(q, keys + (key0 + t) * d, d, scale, w.s.data() + t, KEY_BLOCK);
  for (int64_t r = 0; r < ROWS; ++r) {
    const auto [from, seen] =
        clearformer_flash::keys_seen(position + r, key0, block_keys, visible, causal, window);
    float* s = w.s.data() + r * KEY_BLOCK;
    if (seen <= from) {  // nothing here for this query: weight 0 on every key of the block
      std::memset(s, 0, block_keys * sizeof(float));
      continue;
    }
    const float m_new = clearformer_flash::raise_maximum(
        s, block_keys, from, seen, st.maximum[first + r], st.total[first + r],
        st.out.data() + (first + r) * d, d);
    const __m512 mx = _mm512_set1_ps(m_new);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t c = 0; c < block_keys; c += LANES) {
      const __mmask16 keep = clearformer_flash::seen_lanes(c, from, seen);
      const __m512 e =
          _mm512_maskz_mov_ps(keep, exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + c), mx)));
      sum = _mm512_add_ps(sum, e);
      _mm512_storeu_ps(s + c, e);
    }
    st.total[first + r] += _mm512_reduce_add_ps(sum);
  }
  const float* v = values + key0 * d;
  for (int64_t c0 = 0; c0 < d; c0 += 2 * LANES)
    weighted_8x32(w.s.data(), KEY_BLOCK, v, block_keys, d, c0, st.out.data() + first * d);
}

// One task (QUERY_BLOCK queries from `start` of sequence b, for every query head that reads
// key/value head g): writes their rows of the output.
void run_task(const Task& task, const int64_t* bounds, const int64_t* packed_start, int64_t Np,
              const float* keys, const float* values, const float* qp, int64_t q_row, float* op,
              int64_t H, int64_t d, int64_t group, bool causal, int64_t window, float fscale,
              std::vector<BlockState>& states, Scratch& w) {
  const int64_t T = bounds[task.b + 1] - bounds[task.b];
  const int64_t rows = std::min(QUERY_BLOCK, T - task.start);
  const float* kt = keys + (task.g * Np + packed_start[task.b]) * d;
  const float* vt = values + (task.g * Np + packed_start[task.b]) * d;
  for (int64_t hh = 0; hh < group; ++hh) {
    BlockState& st = states[hh];
    st.reset(d);
    const int64_t h = task.g * group + hh;
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(st.query.data() + r * d,
                  qp + (bounds[task.b] + task.start + r) * q_row + h * d, d * sizeof(float));
  }
  // Blocks of keys in order, every head of the group and every register block of queries on
  // each before the next (the block stays in cache); a register block skips the blocks of keys
  // it cannot see (after its last query when causal, beyond its window).
  int64_t key_begin, key_end;
  clearformer_flash::task_keys(task, rows, T, causal, window, key_begin, key_end);
  for (int64_t key0 = key_begin; key0 < key_end; key0 += KEY_BLOCK)
    for (int64_t hh = 0; hh < group; ++hh)
      for (int64_t first = 0; first < rows; first += ROWS) {
        const int64_t at = task.start + first;
        const int64_t block_keys = clearformer_flash::block_keys_seen(at, key0, T, causal, window);
        if (block_keys == 0) continue;
        step(states[hh], first, at, key0, block_keys, T, causal, window, kt, vt, d, fscale, w);
      }
  for (int64_t hh = 0; hh < group; ++hh) {
    const BlockState& st = states[hh];
    const int64_t h = task.g * group + hh;
    for (int64_t r = 0; r < rows; ++r) {
      const __m512 inv = _mm512_set1_ps(1.0f / st.total[r]);
      float* o = op + (bounds[task.b] + task.start + r) * H * d + h * d;
      for (int64_t c = 0; c < d; c += LANES)
        _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(st.out.data() + r * d + c), inv));
    }
  }
}

// Packed rows: q (N, H, Dh), k and v (N, Hkv, Dh); sequence b is rows cu_seqlens[b] ..
// cu_seqlens[b + 1]; query head h reads key/value head h / (H / Hkv); `window` >= 0: token i
// sees tokens j with |i - j| <= window only (local attention). Returns (N, H, Dh).
at::Tensor flash_attention_f32(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& cu_seqlens, double scale, bool causal,
                               int64_t window) {
  clearformer_flash::check_rows(q, k, v, at::kFloat, "float32");
  TORCH_CHECK(cu_seqlens.dim() == 1 && cu_seqlens.numel() >= 1, "cu_seqlens must be (B + 1,)");
  const int64_t N = q.size(0), H = q.size(1), d = q.size(2), Hkv = k.size(1);
  const int64_t group = H / Hkv;
  auto cu = cu_seqlens.to(at::kLong).contiguous();
  const int64_t* bounds = cu.data_ptr<int64_t>();
  const int64_t B = cu.numel() - 1;
  // Sequence b's keys from packed_start[b] in the packed arrays, padded to whole tiles.
  const std::vector<int64_t> packed_start = clearformer_flash::packed_starts(bounds, B, N);
  const int64_t Np = packed_start[B];
  auto out = at::empty({N, H, d}, q.options());
  if (N == 0) return out;
  // (Hkv, Np, d) each: every key/value head's sequences, packed as the kernel reads them.
  std::vector<float> keys(static_cast<size_t>(Hkv * Np * d));
  std::vector<float> values(static_cast<size_t>(Hkv * Np * d));
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t q_row = q.stride(0), k_row = k.stride(0), v_row = v.stride(0);
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / Hkv, g = item % Hkv;
      const int64_t T = bounds[b + 1] - bounds[b], Tp = packed_start[b + 1] - packed_start[b];
      pack_keys(kp + bounds[b] * k_row + g * d, T, Tp, d, k_row,
                keys.data() + (g * Np + packed_start[b]) * d);
      pack_values(vp + bounds[b] * v_row + g * d, T, Tp, d, v_row,
                  values.data() + (g * Np + packed_start[b]) * d);
    }
  });
  // Tasks: (sequence, key/value head, block of queries), the costliest first.
  const std::vector<Task> tasks = clearformer_flash::make_tasks(bounds, B, Hkv, causal, window);
  std::atomic<int64_t> next{0};
  const float fscale = static_cast<float>(scale);
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    Scratch w;
    std::vector<BlockState> states(group);
    for (int64_t i = next++; i < static_cast<int64_t>(tasks.size()); i = next++) {
      run_task(tasks[i], bounds, packed_start.data(), Np, keys.data(), values.data(), qp, q_row,
               op, H, d, group, causal, window, fscale, states, w);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(clearformer_avx512, m) {
  m.def(
      "flash_attention_f32(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, float scale, "
      "bool causal, int window=-1) -> Tensor");
}
TORCH_LIBRARY_IMPL(clearformer_avx512, CPU, m) {
  m.impl("flash_attention_f32", &flash_attention_f32);
}
