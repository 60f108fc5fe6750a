// What the two flash kernels (avx512_flash.cpp on float32 rows, avx512_flash_bf16.cpp on
// bfloat16 ones) share: their blocking, the checks of their inputs, which keys each query
// sees, the online softmax's running maximum, and the tasks they split the work into. The
// products and the weights' rounding differ between them; the masks live here once, so the two
// cannot drift apart.

#pragma once

#include <ATen/ATen.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdint>
#include <vector>

namespace clearformer_flash {

constexpr int64_t LANES = 16;        // float32 lanes of one AVX-512 vector
constexpr int64_t KEY_TILE = 32;     // keys per pair of packed tiles: the scores' register block
constexpr int64_t ROWS = 8;          // queries per register block
constexpr int64_t QUERY_BLOCK = 64;  // queries of one head per task
constexpr int64_t KEY_BLOCK = 128;   // keys per softmax step (a multiple of KEY_TILE)

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// q (N, H, Dh), k and v (N, Hkv, Dh) of `dtype` (named `name` in errors) on the CPU, each
// row's heads contiguous, Hkv dividing H, heads a positive multiple of 32 wide.
inline void check_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       at::ScalarType dtype, const char* name) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "q, k, v must be (N, H, Dh), got ",
              q.dim(), ", ", k.dim(), " and ", v.dim(), " dimensions");
  TORCH_CHECK(q.size(2) > 0 && q.size(2) % (2 * LANES) == 0,
              "head width must be a positive multiple of 32, got ", q.size(2));
  for (const at::Tensor* t : {&q, &k, &v}) {
    TORCH_CHECK(t->scalar_type() == dtype && t->device().is_cpu(), "q, k, v must be ", name,
                " on the CPU, got ", t->scalar_type(), " on ", t->device());
    TORCH_CHECK(t->stride(2) == 1 && t->stride(1) == t->size(2),
                "each row's heads must be contiguous, got strides ", t->strides(), " for ",
                t->sizes());
  }
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(2) == q.size(2),
              "k and v must be (N, Hkv, Dh) beside q's (N, H, Dh), got q ", q.sizes(), ", k ",
              k.sizes(), ", v ", v.sizes());
  TORCH_CHECK(k.size(1) >= 1 && q.size(1) % k.size(1) == 0, "key/value heads (", k.size(1),
              ") must divide query heads (", q.size(1), ")");
}

// Where each sequence's keys start in the packed key and value arrays (each sequence padded to
// whole KEY_TILEs), after checking that `bounds` (cu_seqlens, B + 1 entries) cuts N rows.
inline std::vector<int64_t> packed_starts(const int64_t* bounds, int64_t B, int64_t N) {
  TORCH_CHECK(bounds[0] == 0 && bounds[B] == N, "cu_seqlens must start at 0 and end at N = ", N,
              ", got ", bounds[0], " and ", bounds[B]);
  std::vector<int64_t> start(B + 1, 0);
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(bounds[b + 1] >= bounds[b], "cu_seqlens must not decrease, got ", bounds[b],
                " then ", bounds[b + 1]);
    start[b + 1] = start[b] + round_up(bounds[b + 1] - bounds[b], KEY_TILE);
  }
  return start;
}

// The keys the query at position `at` sees within the block of `block_keys` keys from `key0`,
// as [from, seen) offsets in the block: below `visible` (the sequence's length), up to its own
// position when `causal`, within `window` of it when window >= 0. Empty when from >= seen.
struct Seen { int64_t from, seen; };
inline Seen keys_seen(int64_t at, int64_t key0, int64_t block_keys, int64_t visible, bool causal,
                      int64_t window) {
  int64_t lo = 0, hi = causal ? std::min(visible, at + 1) : visible;
  if (window >= 0) {
    lo = std::max<int64_t>(0, at - window);
    hi = std::min(hi, at + window + 1);
  }
  return {std::clamp<int64_t>(lo - key0, 0, block_keys),
          std::clamp<int64_t>(hi - key0, 0, block_keys)};
}

// Lanes of the 16 keys from offset c of a block that lie in [from, seen).
inline __mmask16 seen_lanes(int64_t c, int64_t from, int64_t seen) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  return _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32(seen - c)) &
         _mm512_cmpge_epi32_mask(lane, _mm512_set1_epi32(from - c));
}

// The online softmax's running maximum of one query after the scores s[from, seen) of a block
// of `block_keys` keys: where it grows, the sums so far (`total`, and its weighted sum `out`,
// d values) shrink by exp(old - new) first (exp(-inf) = 0 for a query's first keys). Returns
// the new maximum, which the block's weights are taken against.
inline float raise_maximum(const float* s, int64_t block_keys, int64_t from, int64_t seen,
                           float& maximum, float& total, float* out, int64_t d) {
  __m512 block_max = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t c = 0; c < block_keys; c += LANES)
    block_max = _mm512_mask_max_ps(block_max, seen_lanes(c, from, seen), block_max,
                                   _mm512_loadu_ps(s + c));
  const float m_new = std::max(maximum, _mm512_reduce_max_ps(block_max));
  if (m_new > maximum) {
    const float shrink = std::exp(maximum - m_new);
    total *= shrink;
    const __m512 f = _mm512_set1_ps(shrink);
    for (int64_t c = 0; c < d; c += LANES)
      _mm512_storeu_ps(out + c, _mm512_mul_ps(_mm512_loadu_ps(out + c), f));
    maximum = m_new;
  }
  return m_new;
}

// One task: QUERY_BLOCK queries from `start` of sequence b, for every query head that reads
// key/value head g. `cost`: the keys its queries may see, for the order tasks are taken in.
struct Task { int64_t b, g, start, cost; };

// Every task, costliest first (the latest blocks where causal: they see the most keys).
inline std::vector<Task> make_tasks(const int64_t* bounds, int64_t B, int64_t Hkv, bool causal,
                                    int64_t window) {
  std::vector<Task> tasks;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t T = bounds[b + 1] - bounds[b];
    for (int64_t start = 0; start < T; start += QUERY_BLOCK)
      for (int64_t g = 0; g < Hkv; ++g)
        tasks.push_back({b, g, start,
                         (causal ? std::min(T, start + QUERY_BLOCK) : T) -
                             (window >= 0 ? std::max<int64_t>(0, start - window) : 0)});
  }
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& a, const Task& c) { return a.cost > c.cost; });
  return tasks;
}

// The keys a task's `rows` queries may see, [begin, end): none after the last query when
// causal, none beyond the window of the first and last queries.
inline void task_keys(const Task& task, int64_t rows, int64_t T, bool causal, int64_t window,
                      int64_t& begin, int64_t& end) {
  begin = 0;
  end = causal ? task.start + rows : T;
  if (window >= 0) {
    begin = std::max<int64_t>(0, task.start - window) / KEY_TILE * KEY_TILE;
    end = std::min(end, task.start + rows + window);
  }
}

// The keys of the block from `key0` that the register block of ROWS queries from position `at`
// can see, in whole tiles (fewer at the end of the sequence and, when causal, on the
// diagonal); 0 when it sees none of them and skips the block.
inline int64_t block_keys_seen(int64_t at, int64_t key0, int64_t T, bool causal, int64_t window) {
  int64_t last = causal ? std::min(T, at + ROWS) : T;
  int64_t earliest = 0;
  if (window >= 0) {
    last = std::min(last, at + ROWS + window);
    earliest = at - window;
  }
  if (last <= key0 || key0 + KEY_BLOCK <= earliest) return 0;
  return std::min(KEY_BLOCK, round_up(last - key0, KEY_TILE));
}

}  // namespace clearformer_flash
