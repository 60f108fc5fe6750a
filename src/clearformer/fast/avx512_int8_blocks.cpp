// An int8 linear layer with a scale per block of 32 weights, on AVX512-VNNI.
//
//   y[m, n] = s_x[m] * sum_b s_w[n, b] * sum_{k in block b} q_x[m, k] * q_w[n, k]  (+ bias[n])
//
// The weights are int8 with one scale per output channel and block of 32 inputs (the blocks of
// GGUF's Q8_0); each row of activations is rounded to int16 with one scale per row, which at 15
// bits loses next to nothing, so the weights' rounding is the only approximation that matters.
// The products run on vpdpwssd (two int16 x int16 products summed into each int32 lane): the
// int8 weights are widened to int16 in registers (vpmovsxbw), so they are read from memory as
// one byte each. A block's 32 products are summed exactly in int32 (32 x 32767 x 127 < 2^31),
// converted to float32 and multiplied by the block's weight scale into a float32 sum; the row's
// activation scale and the bias are applied once at the end.
//
// Packed weight layout (clearformer.quant.int8_blocks.pack_weights):
//   weight (P, K/2, 32, 2) int8: panel p holds output columns 32p..32p+31; for each pair of
//          inputs (2j, 2j+1) the 32 columns' two weights, so that 32 bytes widen to the 16 int32
//          lanes vpdpwssd multiplies against one broadcast pair of activations.
//   scale  (P, K/32, 32) float32: panel p's weight scale for each block and column.
// K is a multiple of 32 (the packing pads it with zero weights); N may end inside a panel.
//
// Work: rows are taken in chunks whose int16 activations fit in L2; within a chunk the threads
// split the (panel, row tile) pairs, panel by panel, so a panel's weights are read from memory
// about once per chunk and from cache for each of its tiles.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace {

#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni,fma")))

constexpr int64_t BLOCK = 32;       // inputs per weight scale
constexpr int64_t PANEL = 32;       // output columns per panel: two 16-lane vectors
constexpr int64_t TILE_ROWS = 6;    // rows per register tile: 12 int32 + 12 float32 sums
constexpr int64_t CHUNK_BYTES = 256 * 1024;  // one chunk's int16 activations
constexpr float INT16_MAX_F = 32767.0f;

// Below this a row's maximum would overflow 32767 / peak: the row rounds to zeros (its
// products are below float32's resolution beside any bias), as the Python reference does.
constexpr float MIN_PEAK = 1e-30f;

// Row m of x (K floats) -> q (Kp int16, zeros past K) and its scale amax / 32767. A row holding
// NaN or an infinity gets scale NaN and zeros, so that its outputs are NaN: a non-finite input
// must not come out finite.
VNNI_TARGET void quantize_row(const float* x, int64_t K, int64_t Kp, int16_t* q, float* scale) {
  __m512 amax = _mm512_setzero_ps();
  __mmask16 unordered = 0;
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m512 v = _mm512_loadu_ps(x + k);
    unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
  }
  float peak = _mm512_reduce_max_ps(amax);
  bool finite = unordered == 0 && std::isfinite(peak);
  for (; k < K; ++k) {
    finite = finite && std::isfinite(x[k]);
    peak = std::max(peak, std::fabs(x[k]));
  }
  if (!finite || !(peak >= MIN_PEAK)) {
    std::memset(q, 0, Kp * sizeof(int16_t));
    *scale = finite ? 1.0f : std::numeric_limits<float>::quiet_NaN();
    return;
  }
  const float inverse = INT16_MAX_F / peak;
  *scale = peak / INT16_MAX_F;
  const __m512 inv = _mm512_set1_ps(inverse);
  k = 0;
  for (; k + 16 <= K; k += 16) {
    // Round to nearest even (the default rounding mode), as torch.round does.
    __m512i rounded = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), inv));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k), _mm512_cvtsepi32_epi16(rounded));
  }
  for (; k < K; ++k) q[k] = static_cast<int16_t>(std::nearbyint(x[k] * inverse));
  for (; k < Kp; ++k) q[k] = 0;
}

// R rows (R <= TILE_ROWS) of q against one panel: out[r, 0:width] of the rows' results.
template <int R>
VNNI_TARGET void tile(const int16_t* q, int64_t Kp, const float* row_scale, const int8_t* panel,
                      const float* panel_scale, const float* bias, float* out, int64_t N,
                      int64_t width) {
  __m512 total[R][2];
  for (int r = 0; r < R; ++r) total[r][0] = total[r][1] = _mm512_setzero_ps();
  const int64_t blocks = Kp / BLOCK;
  for (int64_t b = 0; b < blocks; ++b) {
    __m512i sum[R][2];
    for (int r = 0; r < R; ++r) sum[r][0] = sum[r][1] = _mm512_setzero_si512();
    const int8_t* w = panel + b * (BLOCK / 2) * PANEL * 2;
    const int16_t* qb = q + b * BLOCK;
    for (int64_t pair = 0; pair < BLOCK / 2; ++pair) {
      const __m512i w0 = _mm512_cvtepi8_epi16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + pair * PANEL * 2)));
      const __m512i w1 = _mm512_cvtepi8_epi16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + pair * PANEL * 2 + 32)));
      for (int r = 0; r < R; ++r) {
        int32_t two;
        std::memcpy(&two, qb + r * Kp + 2 * pair, sizeof(two));
        const __m512i x = _mm512_set1_epi32(two);
        sum[r][0] = _mm512_dpwssd_epi32(sum[r][0], x, w0);
        sum[r][1] = _mm512_dpwssd_epi32(sum[r][1], x, w1);
      }
    }
    const __m512 s0 = _mm512_loadu_ps(panel_scale + b * PANEL);
    const __m512 s1 = _mm512_loadu_ps(panel_scale + b * PANEL + 16);
    for (int r = 0; r < R; ++r) {
      total[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r][0]), s0, total[r][0]);
      total[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r][1]), s1, total[r][1]);
    }
  }
  const __mmask16 m0 = width >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << width) - 1);
  const __mmask16 m1 =
      width >= 32 ? 0xFFFF : (width <= 16 ? 0 : static_cast<__mmask16>((1u << (width - 16)) - 1));
  const __m512 b0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
  const __m512 b1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) {
    const __m512 s = _mm512_set1_ps(row_scale[r]);
    _mm512_mask_storeu_ps(out + r * N, m0, _mm512_fmadd_ps(total[r][0], s, b0));
    _mm512_mask_storeu_ps(out + r * N + 16, m1, _mm512_fmadd_ps(total[r][1], s, b1));
  }
}

VNNI_TARGET void run_tile(int64_t rows, const int16_t* q, int64_t Kp, const float* row_scale,
                          const int8_t* panel, const float* panel_scale, const float* bias,
                          float* out, int64_t N, int64_t width) {
  switch (rows) {
    case 6: tile<6>(q, Kp, row_scale, panel, panel_scale, bias, out, N, width); break;
    case 5: tile<5>(q, Kp, row_scale, panel, panel_scale, bias, out, N, width); break;
    case 4: tile<4>(q, Kp, row_scale, panel, panel_scale, bias, out, N, width); break;
    case 3: tile<3>(q, Kp, row_scale, panel, panel_scale, bias, out, N, width); break;
    case 2: tile<2>(q, Kp, row_scale, panel, panel_scale, bias, out, N, width); break;
    default: tile<1>(q, Kp, row_scale, panel, panel_scale, bias, out, N, width); break;
  }
}

at::Tensor int8_block_linear(const at::Tensor& x, const at::Tensor& weight,
                             const at::Tensor& scale, const c10::optional<at::Tensor>& bias,
                             int64_t out_features) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be a contiguous (M, K) float32 tensor, got ", x.scalar_type(), " of shape ",
              x.sizes());
  TORCH_CHECK(weight.dim() == 4 && weight.scalar_type() == at::kChar && weight.is_contiguous() &&
                  weight.size(2) == PANEL && weight.size(3) == 2,
              "weight must be the packed (P, K/2, 32, 2) int8 layout, got ", weight.scalar_type(),
              " of shape ", weight.sizes());
  const int64_t M = x.size(0), K = x.size(1), N = out_features;
  const int64_t panels = weight.size(0), Kp = weight.size(1) * 2;
  TORCH_CHECK(K > 0 && Kp % BLOCK == 0 && Kp >= K && Kp < K + BLOCK,
              "x's width K must be in (Kp - 32, Kp] for the packed weight's Kp = ", Kp, ", got ",
              K);
  TORCH_CHECK(N > (panels - 1) * PANEL && N <= panels * PANEL,
              "out_features must be in (32 (P - 1), 32 P] for the packed weight's P = ", panels,
              " panels, got ", N);
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.dim() == 3 &&
                  scale.size(0) == panels && scale.size(1) == Kp / BLOCK &&
                  scale.size(2) == PANEL,
              "scale must be the packed (", panels, ", ", Kp / BLOCK, ", 32) float32 layout, got ",
              scale.scalar_type(), " of shape ", scale.sizes());
  const float* bias_data = nullptr;
  at::Tensor bias_c;
  if (bias.has_value() && bias->defined()) {
    bias_c = bias->contiguous();
    TORCH_CHECK(bias_c.scalar_type() == at::kFloat && bias_c.numel() == N,
                "bias must hold out_features = ", N, " float32 values, got ", bias_c.numel(),
                " of ", bias_c.scalar_type());
    bias_data = bias_c.data_ptr<float>();
  }
  at::Tensor out = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return out;

  at::Tensor q = at::empty({M, Kp}, x.options().dtype(at::kShort));  // (M, Kp) int16
  at::Tensor row_scale = at::empty({M}, x.options());                 // (M,) float32
  const float* xd = x.data_ptr<float>();
  int16_t* qd = q.data_ptr<int16_t>();
  float* sd = row_scale.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) quantize_row(xd + m * K, K, Kp, qd + m * Kp, sd + m);
  });

  const int8_t* wd = weight.data_ptr<int8_t>();
  const float* scd = scale.data_ptr<float>();
  float* od = out.data_ptr<float>();
  const int64_t panel_bytes = (Kp / 2) * PANEL * 2;
  const int64_t panel_scales = (Kp / BLOCK) * PANEL;
  const int64_t fit = std::max<int64_t>(1, CHUNK_BYTES / (Kp * 2) / TILE_ROWS) * TILE_ROWS;
  for (int64_t first = 0; first < M; first += fit) {
    const int64_t last = std::min(M, first + fit);
    const int64_t tiles = (last - first + TILE_ROWS - 1) / TILE_ROWS;
    // One task per (panel, row tile), panel-major: a thread's run of tasks reuses each panel's
    // weights from cache, and a chunk of few panels still spreads over every thread.
    at::parallel_for(0, panels * tiles, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t p = task / tiles;
        const int64_t m = first + (task % tiles) * TILE_ROWS;
        const int64_t width = std::min(PANEL, N - p * PANEL);
        const float* panel_bias = bias_data ? bias_data + p * PANEL : nullptr;
        run_tile(std::min(TILE_ROWS, last - m), qd + m * Kp, Kp, sd + m, wd + p * panel_bytes,
                 scd + p * panel_scales, panel_bias, od + m * N + p * PANEL, N, width);
      }
    });
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(clearformer_avx512, m) {
  m.def(
      "int8_block_linear(Tensor x, Tensor weight, Tensor scale, Tensor? bias, "
      "int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(clearformer_avx512, CPU, m) { m.impl("int8_block_linear", &int8_block_linear); }
