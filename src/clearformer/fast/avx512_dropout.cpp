// Dropout for float32 and bfloat16 on AVX-512 CPUs, its mask drawn from Philox4x32-10:
//   out[i] = input[i] * (word(seed, i) >= threshold ? scale : 0)
// where word(seed, i) is element i's 32-bit word of clearformer.philox.mask_words (its
// docstring gives the order), so P(drop) = threshold / 2**32. The same call on the output
// gradient is dropout's backward: the mask is redrawn from the seed, never stored.
//
// PyTorch's CPU dropout draws a Bernoulli sample per element from its Mersenne Twister, one
// word after another on one thread, then multiplies: several nanoseconds an element, while a
// counter-based generator computes 16 blocks of 4 words in a handful of vector
// multiplications. Every element's word depends only on (seed, i), so the result is the same
// for any thread count and any split of the work.
//
// The product is input * factor with factor 0 for a dropped element, as PyTorch's
// input * noise: an infinite or NaN input gives NaN where dropped, as there. bfloat16 inputs
// are widened, multiplied in float32 and rounded to the nearest even bfloat16, as PyTorch's
// bfloat16 multiplication does. Built by clearformer.fast.avx512 with the other kernels into
// one library.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace {

constexpr int64_t GROUP = 64;  // elements of one step: 16 Philox blocks of 4 words
constexpr int64_t GRAIN = 1024;  // groups per thread's share at least (64k elements)

// The high and low 32-bit words of a * m, 16 lanes (m the same in every lane).
inline void mulhilo(__m512i a, __m512i m, __m512i& high, __m512i& low) {
  const __m512i even = _mm512_mul_epu32(a, m);  // 64-bit products of lanes 0, 2, ...
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);  // ... of lanes 1, 3, ...
  low = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  high = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

// Philox4x32-10 on 16 counters (c0, c1, 0, 0) under the key (k0, k1): the 4 output words.
inline void philox16(__m512i c0, __m512i c1, uint32_t k0, uint32_t k1, __m512i words[4]) {
  __m512i c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m512i m1 = _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u));
  for (int round = 0; round < 10; ++round) {
    if (round) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    __m512i high0, low0, high1, low1;
    mulhilo(c0, m0, high0, low0);
    mulhilo(c2, m1, high1, low1);
    const __m512i key0 = _mm512_set1_epi32(static_cast<int>(k0));
    const __m512i key1 = _mm512_set1_epi32(static_cast<int>(k1));
    c0 = _mm512_xor_si512(_mm512_xor_si512(high1, c1), key0);
    c1 = low1;
    c2 = _mm512_xor_si512(_mm512_xor_si512(high0, c3), key1);
    c3 = low0;
  }
  words[0] = c0;
  words[1] = c1;
  words[2] = c2;
  words[3] = c3;
}

// float32 -> bfloat16, rounded to the nearest even; NaN stays NaN.
inline __m256i to_bf16(__m512 y) {
  const __m512i bits = _mm512_castps_si512(y);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  const __mmask16 nan = _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);
  rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC00000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}

inline __m512 from_bf16(__m256i raw) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// The 16 elements at `at` (count of them left: `left`, at most 16 used) times `factor`.
inline void scale_f32(const float* in, float* out, int64_t left, __m512 factor) {
  const __mmask16 lanes = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
  const __m512 x = _mm512_maskz_loadu_ps(lanes, in);
  _mm512_mask_storeu_ps(out, lanes, _mm512_mul_ps(x, factor));
}

inline void scale_bf16(const uint16_t* in, uint16_t* out, int64_t left, __m512 factor) {
  if (left >= 16) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in));
    const __m256i y = to_bf16(_mm512_mul_ps(from_bf16(raw), factor));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), y);
    return;
  }
  uint16_t buffer[16] = {};
  std::memcpy(buffer, in, left * sizeof(uint16_t));
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(buffer));
  const __m256i y = to_bf16(_mm512_mul_ps(from_bf16(raw), factor));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(buffer), y);
  std::memcpy(out, buffer, left * sizeof(uint16_t));
}

template <typename Scale, typename T>
void run(const T* in, T* out, int64_t n, uint64_t seed, uint32_t threshold, float scale,
         Scale scale_rows) {
  const int64_t groups = (n + GROUP - 1) / GROUP;
  const uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  at::parallel_for(0, groups, GRAIN, [&](int64_t begin, int64_t end) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i limit = _mm512_set1_epi32(static_cast<int>(threshold));
    const __m512 kept = _mm512_set1_ps(scale);
    __m512i words[4];
    for (int64_t g = begin; g < end; ++g) {
      // Blocks g * 16 + lane: the low word never carries (g * 16 ends in four zero bits).
      const uint64_t block = static_cast<uint64_t>(g) * 16;
      const __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(block)), lane);
      const __m512i c1 = _mm512_set1_epi32(static_cast<int>(block >> 32));
      philox16(c0, c1, k0, k1, words);
      for (int w = 0; w < 4; ++w) {
        const int64_t start = g * GROUP + w * 16;
        if (start >= n) break;
        const __mmask16 keep = _mm512_cmp_epu32_mask(words[w], limit, _MM_CMPINT_NLT);
        scale_rows(in + start, out + start, n - start, _mm512_maskz_mov_ps(keep, kept));
      }
    }
  });
}

at::Tensor counter_dropout(const at::Tensor& input, int64_t seed, int64_t threshold,
                           double scale) {
  TORCH_CHECK(input.device().is_cpu(), "counter_dropout: input must be on the CPU, got ",
              input.device());
  const auto dtype = input.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
              "counter_dropout: input must be float32 or bfloat16, got ", dtype);
  TORCH_CHECK(threshold >= 0 && threshold <= 0xFFFFFFFFLL,
              "counter_dropout: threshold must be in [0, 2**32), got ", threshold);
  const at::Tensor x = input.contiguous();
  at::Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
  const int64_t n = x.numel();
  const auto seed_bits = static_cast<uint64_t>(seed);
  const auto limit = static_cast<uint32_t>(threshold);
  const auto factor = static_cast<float>(scale);
  if (dtype == at::kFloat) {
    run(x.data_ptr<float>(), out.data_ptr<float>(), n, seed_bits, limit, factor, scale_f32);
  } else {
    const auto* in = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
    auto* result = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
    run(in, result, n, seed_bits, limit, factor, scale_bf16);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(clearformer_avx512, m) {
  m.def("counter_dropout(Tensor input, int seed, int threshold, float scale) -> Tensor");
}
TORCH_LIBRARY_IMPL(clearformer_avx512, CPU, m) {
  m.impl("counter_dropout", &counter_dropout);
}
