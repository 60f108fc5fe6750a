// Attention on bfloat16 rows for CPUs with AVX512-BF16: causal or bidirectional, local
// (a window) or global, grouped-query
// keys and values read in place of their query heads, any sequence length (flash-style: the
// scores of a block of keys at a time, never the whole (T, T) matrix).
//
// Why: at long inputs attention is half of a grouped-query model's work (Qwen3-Embedding at
// 8k tokens), and PyTorch's CPU flash kernel computes bfloat16 attention at nearly its float32
// rate on a CPU without AMX: its products widen to float32. AVX512-BF16's vdpbf16ps multiplies
// pairs of bfloat16 values into float32 sums, twice the products of a float32 FMA per
// instruction. Here both products of attention run on it:
//
// - scores: the keys of a sequence's key/value head are packed once into tiles of 16 keys by
//   head-dimension pairs (pack_keys), so one vdpbf16ps gives 16 keys two dimensions further;
//   a query's dimension pair is one 32-bit broadcast. Eight queries by 32 keys: 16
//   accumulators.
// - weighted values: the probabilities are rounded to bfloat16 (as flash attention in bfloat16
//   does on GPUs) and the values packed as pairs of consecutive keys per column (pack_values),
//   so one vdpbf16ps adds two keys' contributions to 16 columns. Eight queries by 32 columns.
//
// Softmax is the online one (running maximum and sum per query, the output rescaled when the
// maximum grows), all in float32; masked keys (causal, and the tail of a tile) get weight
// exactly 0, whatever their keys hold, so their finite values add exactly nothing (an infinite
// or NaN value of a later token of the same sequence poisons the sum, as in PyTorch's
// kernels); other sequences' rows are never read. One task
// is a block of QUERY_BLOCK queries of every query head that shares one key/value head, so a
// block of keys is read from cache by all of them; tasks are taken from a shared counter,
// costliest (latest causal blocks) first, and each task's sums run in a fixed order, so the
// result does not depend on the thread count. Built with the other AVX-512 kernels
// (clearformer.fast.avx512); its functions carry the bf16 target themselves, so the library
// still loads on AVX-512 CPUs without it (clearformer.fast.avx512.flash_serves says when it
// runs; a compiler without AVX512-BF16 intrinsics builds the library without this kernel).

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

// AVX512-BF16 intrinsics: GCC 10 and Clang 9 onwards; an older compiler builds the library
// without this kernel (the op is then not registered, and clearformer.fast.avx512 sees that).
#if (defined(__clang__) && __clang_major__ >= 9) || \
    (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10)
#define CLEARFORMER_FLASH_BF16 1
#endif

#ifdef CLEARFORMER_FLASH_BF16
namespace {

#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512bf16,fma")))

using clearformer_avx512::exp_nonpositive;  // avx512_exp.h
// avx512_flash_plan.h: the blocking, the checks, the keys each query sees, the tasks.
using clearformer_flash::KEY_BLOCK;
using clearformer_flash::KEY_TILE;
using clearformer_flash::LANES;
using clearformer_flash::QUERY_BLOCK;
using clearformer_flash::ROWS;
using clearformer_flash::Task;

// Keys of one (sequence, key/value head): rows k[j * row_stride + 0 .. d) for j < T, packed as
// tiles of 16 keys: tile t, dimension pair p, lane l holds (k[16t + l][2p], k[16t + l][2p + 1]).
// Keys from T up to Tp (a multiple of KEY_TILE) are zeros; their weights are 0 anyway.
void pack_keys(const uint16_t* k, int64_t T, int64_t Tp, int64_t d, int64_t row_stride,
               uint32_t* out) {
  const int64_t pairs = d / 2;
  for (int64_t t = 0; t < Tp / LANES; ++t) {
    uint32_t* tile = out + t * pairs * LANES;
    for (int64_t lane = 0; lane < LANES; ++lane) {
      const int64_t j = t * LANES + lane;
      if (j < T) {
        const uint32_t* row = reinterpret_cast<const uint32_t*>(k + j * row_stride);
        for (int64_t p = 0; p < pairs; ++p) tile[p * LANES + lane] = row[p];
      } else {
        for (int64_t p = 0; p < pairs; ++p) tile[p * LANES + lane] = 0;
      }
    }
  }
}

// Values of one (sequence, key/value head), packed as pairs of consecutive keys per column:
// entry (j / 2, c) holds (v[j][c], v[j + 1][c]); keys from T up to Tp are zeros.
void pack_values(const uint16_t* v, int64_t T, int64_t Tp, int64_t d, int64_t row_stride,
                 uint16_t* out) {
  for (int64_t j = 0; j < Tp; j += 2) {
    uint16_t* pair = out + j * d;  // (d, 2)
    const uint16_t* a = j < T ? v + j * row_stride : nullptr;
    const uint16_t* b = j + 1 < T ? v + (j + 1) * row_stride : nullptr;
    for (int64_t c = 0; c < d; ++c) {
      pair[2 * c] = a ? a[c] : 0;
      pair[2 * c + 1] = b ? b[c] : 0;
    }
  }
}

// The running state of one query head's block of queries.
struct BlockState {
  std::vector<float> out;       // (QUERY_BLOCK, d): the unnormalised weighted sum
  std::vector<float> maximum;   // (QUERY_BLOCK,): the largest score seen
  std::vector<float> total;     // (QUERY_BLOCK,): sum of exp(score - maximum)
  std::vector<uint32_t> query;  // (QUERY_BLOCK, d / 2): the queries as bfloat16 pairs
  void reset(int64_t d) {
    out.assign(QUERY_BLOCK * d, 0.0f);
    maximum.assign(QUERY_BLOCK, -std::numeric_limits<float>::infinity());
    total.assign(QUERY_BLOCK, 0.0f);
    query.assign(QUERY_BLOCK * d / 2, 0u);
  }
};

// Scores of ROWS queries (query pairs q, (ROWS, pairs)) against KEY_TILE keys starting at
// packed tile `tile` (two 16-key tiles): s[r][0 .. 32) = scale * q_r . k.
BF16_TARGET inline void scores_8x32(const uint32_t* q, const uint32_t* tiles, int64_t pairs,
                                    float scale, float* s, int64_t s_stride) {
  __m512 acc[ROWS][2];
  for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const uint32_t* t0 = tiles;
  const uint32_t* t1 = tiles + pairs * LANES;
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh k0 = (__m512bh)_mm512_loadu_si512(t0 + p * LANES);
    const __m512bh k1 = (__m512bh)_mm512_loadu_si512(t1 + p * LANES);
    for (int r = 0; r < ROWS; ++r) {
      const __m512bh qb = (__m512bh)_mm512_set1_epi32(static_cast<int>(q[r * pairs + p]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], qb, k0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], qb, k1);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int r = 0; r < ROWS; ++r) {
    _mm512_storeu_ps(s + r * s_stride, _mm512_mul_ps(acc[r][0], sc));
    _mm512_storeu_ps(s + r * s_stride + LANES, _mm512_mul_ps(acc[r][1], sc));
  }
}

// out[r][c0 .. c0 + 32) += sum over key pairs of p[r][pair] . values[pair][c0 ..]: ROWS
// queries, `pairs` key pairs of bfloat16 weights (p, (ROWS, p_stride) in 32-bit pairs).
BF16_TARGET inline void weighted_8x32(const uint32_t* p, int64_t p_stride, const uint16_t* values,
                                      int64_t pairs, int64_t d, int64_t c0, float* out) {
  __m512 acc[ROWS][2];
  for (int r = 0; r < ROWS; ++r) {
    acc[r][0] = _mm512_loadu_ps(out + r * d + c0);
    acc[r][1] = _mm512_loadu_ps(out + r * d + c0 + LANES);
  }
  for (int64_t j = 0; j < pairs; ++j) {
    const uint16_t* row = values + j * 2 * d + 2 * c0;
    const __m512bh v0 = (__m512bh)_mm512_loadu_si512(row);
    const __m512bh v1 = (__m512bh)_mm512_loadu_si512(row + 2 * LANES);
    for (int r = 0; r < ROWS; ++r) {
      const __m512bh w = (__m512bh)_mm512_set1_epi32(static_cast<int>(p[r * p_stride + j]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], w, v0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], w, v1);
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    _mm512_storeu_ps(out + r * d + c0, acc[r][0]);
    _mm512_storeu_ps(out + r * d + c0 + LANES, acc[r][1]);
  }
}

struct Scratch {
  std::vector<float> s;       // (ROWS, KEY_BLOCK) scores
  std::vector<uint32_t> p;    // (ROWS, KEY_BLOCK / 2) probabilities as bfloat16 pairs
  Scratch() : s(ROWS * KEY_BLOCK), p(ROWS * KEY_BLOCK / 2) {}
};

// One step of ROWS queries (rows first .. first + ROWS of the block, positions `position`
// onwards in their sequence) over the keys key0 .. key0 + block_keys of the packed K and V.
// `visible`: keys below it exist; `causal`: query at position i sees keys j <= i; `window`
// (>= 0): it sees keys j with |i - j| <= window only.
BF16_TARGET void step(BlockState& st, int64_t first, int64_t position, int64_t key0,
                      int64_t block_keys, int64_t visible, bool causal, int64_t window,
                      const uint32_t* keys, const uint16_t* values, int64_t d, float scale,
                      Scratch& w) {
  const int64_t pairs = d / 2;
  const uint32_t* q = st.query.data() + first * pairs;
  for (int64_t t = 0; t < block_keys; t += KEY_TILE)
    scores_8x32(q, keys + (key0 + t) / LANES * pairs * LANES, pairs, scale, w.s.data() + t,
                KEY_BLOCK);
  for (int64_t r = 0; r < ROWS; ++r) {
    const auto [from, seen] =
        clearformer_flash::keys_seen(position + r, key0, block_keys, visible, causal, window);
    float* s = w.s.data() + r * KEY_BLOCK;
    uint16_t* p16 = reinterpret_cast<uint16_t*>(w.p.data() + r * KEY_BLOCK / 2);
    if (seen <= from) {  // nothing here for this query: weight 0 on every key of the block
      std::memset(p16, 0, block_keys * sizeof(uint16_t));
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
      const __m256bh rounded = _mm512_cvtneps_pbh(e);
      // The sum of the weights as rounded, so that they add up to exactly what divides them.
      sum = _mm512_add_ps(sum, _mm512_cvtpbh_ps(rounded));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p16 + c), (__m256i)rounded);
    }
    st.total[first + r] += _mm512_reduce_add_ps(sum);
  }
  const uint16_t* v = values + key0 * d;
  for (int64_t c0 = 0; c0 < d; c0 += 2 * LANES)
    weighted_8x32(w.p.data(), KEY_BLOCK / 2, v, block_keys / 2, d, c0,
                  st.out.data() + first * d);
}

// One task (QUERY_BLOCK queries from `start` of sequence b, for every query head that reads
// key/value head g): writes their rows of the output.

BF16_TARGET void run_task(const Task& task, const int64_t* bounds, const int64_t* packed_start,
                          int64_t Np, const uint32_t* keys, const uint16_t* values,
                          const uint16_t* qp, int64_t q_row, uint16_t* op, int64_t H, int64_t d,
                          int64_t group, bool causal, int64_t window, float fscale,
                          std::vector<BlockState>& states, Scratch& w) {
  const int64_t pairs = d / 2;
  const int64_t T = bounds[task.b + 1] - bounds[task.b];
  const int64_t rows = std::min(QUERY_BLOCK, T - task.start);
  const uint32_t* kt = keys + (task.g * Np + packed_start[task.b]) * pairs;
  const uint16_t* vt = values + (task.g * Np + packed_start[task.b]) * d;
  for (int64_t hh = 0; hh < group; ++hh) {
    BlockState& st = states[hh];
    st.reset(d);
    const int64_t h = task.g * group + hh;
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(st.query.data() + r * pairs,
                  qp + (bounds[task.b] + task.start + r) * q_row + h * d, d * 2);
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
      uint16_t* o = op + (bounds[task.b] + task.start + r) * H * d + h * d;
      for (int64_t c = 0; c < d; c += LANES) {
        const __m512 y = _mm512_mul_ps(_mm512_loadu_ps(st.out.data() + r * d + c), inv);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + c), (__m256i)_mm512_cvtneps_pbh(y));
      }
    }
  }
}

// Packed rows: q (N, H, Dh), k and v (N, Hkv, Dh); sequence b is rows cu_seqlens[b] ..
// cu_seqlens[b + 1]; query head h reads key/value head h / (H / Hkv); `window` >= 0: token i
// sees tokens j with |i - j| <= window only (local attention). Returns (N, H, Dh).
BF16_TARGET at::Tensor flash_attention_bf16(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const at::Tensor& cu_seqlens,
                                            double scale, bool causal, int64_t window) {
  clearformer_flash::check_rows(q, k, v, at::kBFloat16, "bfloat16");
  TORCH_CHECK(cu_seqlens.dim() == 1 && cu_seqlens.numel() >= 1, "cu_seqlens must be (B + 1,)");
  const int64_t N = q.size(0), H = q.size(1), d = q.size(2), Hkv = k.size(1);
  const int64_t group = H / Hkv, pairs = d / 2;
  auto cu = cu_seqlens.to(at::kLong).contiguous();
  const int64_t* bounds = cu.data_ptr<int64_t>();
  const int64_t B = cu.numel() - 1;
  // Sequence b's keys from packed_start[b] in the packed arrays, padded to whole tiles.
  const std::vector<int64_t> packed_start = clearformer_flash::packed_starts(bounds, B, N);
  const int64_t Np = packed_start[B];
  auto out = at::empty({N, H, d}, q.options());
  if (N == 0) return out;
  // (Hkv, Np, d) each: every key/value head's sequences, packed as the kernel reads them.
  std::vector<uint32_t> keys(static_cast<size_t>(Hkv * Np * pairs));
  std::vector<uint16_t> values(static_cast<size_t>(Hkv * Np * d));
  const auto* qp = reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>());
  const auto* kp = reinterpret_cast<const uint16_t*>(k.data_ptr<at::BFloat16>());
  const auto* vp = reinterpret_cast<const uint16_t*>(v.data_ptr<at::BFloat16>());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const int64_t q_row = q.stride(0), k_row = k.stride(0), v_row = v.stride(0);
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / Hkv, g = item % Hkv;
      const int64_t T = bounds[b + 1] - bounds[b], Tp = packed_start[b + 1] - packed_start[b];
      pack_keys(kp + bounds[b] * k_row + g * d, T, Tp, d, k_row,
                keys.data() + (g * Np + packed_start[b]) * pairs);
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
      run_task(tasks[i], bounds, packed_start.data(), Np, keys.data(), values.data(), qp,
               q_row, op, H, d, group, causal, window, fscale, states, w);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(clearformer_avx512, m) {
  m.def(
      "flash_attention_bf16(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, float scale, "
      "bool causal, int window=-1) -> Tensor");
}
TORCH_LIBRARY_IMPL(clearformer_avx512, CPU, m) {
  m.impl("flash_attention_bf16", &flash_attention_bf16);
}
#endif  // CLEARFORMER_FLASH_BF16
