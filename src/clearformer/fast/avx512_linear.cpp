// Linear layers for float32 on AVX-512 CPUs with their epilogue in registers:
//   out = LayerNorm(act(x w^T + bias) + residual)
// where the activation (exact GELU or ReLU), the residual and the LayerNorm are each optional.
// clearformer's own matrix product, for the two places where oneDNN's fused linear op leaves
// work outside the product (docs/performance.md, "Products with their epilogue"):
//
// - oneDNN's exact-GELU post-op evaluates erf through an exponential and a division, about
//   7 % of the first feed-forward product at MiniLM's shapes; the GELU here is a table of
//   polynomials (gelu below) at a third of that cost, and more accurate.
// - A post-norm block normalises right after each residual add, a separate pass over the rows
//   (one LayerNorm call per add). Here a tile row covers whole output rows, so each row is
//   normalised while it is still in cache, right after the product that made it.
//
// The product itself: the weight (N, K) is packed once per caller (pack_linear_weight) into
// N / 64 panels of (K, 64), the panel's 64 columns k by k, one contiguous stream. A register
// tile is 6 rows of x by one panel: 24 accumulators, and per k four vector loads of the panel
// and six broadcasts of x against 24 FMAs, so the loop runs on the FMA units. K is not
// blocked: x's 6 rows stay in L1 for all the panels, the panels stream from L2 or L3 with a
// software prefetch 24 k ahead. Of 12 x 32, 8 x 48, 7 x 64 and 6 x 64 tiles, 6 x 64 was the
// fastest on MiniLM's shapes on an AMD EPYC (Zen 4) core; it matches oneDNN on the second
// feed-forward product and is slower on plain products with 384 inputs, which therefore stay
// with oneDNN (clearformer.fast.avx512_linear says which calls come here).
//
// Few rows (at most FEW_ROWS: one sentence's tokens, or fewer row tiles than threads) take the
// loops the other way round: each panel in turn against every row tile, so the weight streams
// from memory once, not once per tile (a sentence-length call of MiniLM reads its 42 MB of
// weights in the time of its products only this way), and threads take runs of panels, so
// that every thread has work; the LayerNorm then runs after all the panels, over the rows.
//
// Each output element is one sum over k in order, whatever the tiling, the loop order and the
// threads' cuts (threads take runs of 6-row tiles or of panels, and a row's LayerNorm runs on
// one thread), so the result is the same for any thread count and row count. Built by clearformer.fast.avx512
// with avx512_attention.cpp into one library.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <utility>

namespace {

constexpr int VECTORS = 4;                   // AVX-512 vectors per panel row
constexpr int64_t PANEL = 16 * VECTORS;      // output columns per packed panel
constexpr int TILE_ROWS = 6;                 // rows of x per register tile: 24 accumulators
constexpr int64_t PREFETCH = 24;             // k steps ahead that the panel is prefetched
constexpr int64_t FEW_ROWS = 64;             // at most this many rows: panels outer

enum Activation : int64_t { NONE = 0, RELU = 1, GELU = 2 };

// Phi(-t) = erfc(t / sqrt 2) / 2 on [0, 6]: 16 segments of width 3/8, each a polynomial of
// degree 5 in the offset u in [0, 1] within its segment (Chebyshev fits, low order first:
// GELU_TABLE[k][s] is the coefficient of u^k in segment s). Past t = 6, Phi(-t) < 1e-9 and
// counts as 0.
alignas(64) const float GELU_TABLE[6][16] = {
    {0.5f, 0.353830218f, 0.22662735f, 0.130294517f, 0.066807203f, 0.0303963628f, 0.012224474f,
     0.00433244836f, 0.00134989782f, 0.000369078218f, 8.84171532e-05f, 1.85366844e-05f,
     3.39765552e-06f, 5.44037675e-07f, 7.60486074e-08f, 9.27521793e-09f},
    {-0.149603218f, -0.13944535f, -0.112926304f, -0.0794537067f, -0.0485692099f, -0.025794981f,
     -0.0119024348f, -0.00477157487f, -0.00166192593f, -0.000502902665f, -0.000132213812f,
     -3.01987075e-05f, -5.99261648e-06f, -1.03313971e-06f, -1.54744043e-07f, -2.01362642e-08f},
    {-1.47853257e-06f, 0.00980122015f, 0.0158775095f, 0.016759349f, 0.0136613604f,
     0.00906999316f, 0.0050220876f, 0.00234859483f, 0.000934643962f, 0.000318055419f,
     9.28564186e-05f, 2.3312803e-05f, 5.04199988e-06f, 9.40604934e-07f, 1.5151322e-07f,
     2.10903259e-08f},
    {0.00351225911f, 0.00282372395f, 0.00117003452f, -0.000492559804f, -0.00142835744f,
     -0.00152726599f, -0.00113668677f, -0.000659208512f, -0.000310778967f, -0.000121621997f,
     -3.99879609e-05f, -1.11305399e-05f, -2.63646757e-06f, -5.33401192e-07f, -9.24279036e-08f,
     -1.37461944e-08f},
    {-1.02058912e-05f, -0.000357248529f, -0.000477607566f, -0.000345557462f, -0.000109984678f,
     6.72754832e-05f, 0.000128236774f, 0.000108120243f, 6.41693186e-05f, 2.96223079e-05f,
     1.10707642e-05f, 3.4196853e-06f, 8.83874009e-07f, 1.92697769e-07f, 3.56343435e-08f,
     5.61219204e-09f},
    {-6.71182206e-05f, -2.52220234e-05f, 2.35295574e-05f, 4.51615524e-05f, 3.53536088e-05f,
     1.30887584e-05f, -3.22745245e-06f, -8.4821213e-06f, -6.92798585e-06f, -3.81420978e-06f,
     -1.60595243e-06f, -5.42301791e-07f, -1.50418899e-07f, -3.47539277e-08f, -6.74970968e-09f,
     -1.10884912e-09f},
};

// The exact GELU, x Phi(x), written max(x, 0) - |x| Phi(-|x|) (equal for either sign), with
// Phi(-|x|) from the table: the segment's index picks each coefficient out of a register
// (one permute per coefficient), Horner's rule does the rest. Absolute error below 2.5e-7 on
// [-12, 12] and relative error below 1e-5 where |GELU(x)| > 1e-3 (tested against float64),
// against oneDNN's 3.8e-7 and 2.2e-4. Like torch.nn.functional.gelu it gives NaN for NaN and
// for either infinity: (x - x) is NaN there and 0 elsewhere.
inline __m512 gelu(__m512 x) {
  const __m512 t = _mm512_andnot_ps(_mm512_set1_ps(-0.0f), x);  // |x|
  const __m512 s = _mm512_mul_ps(_mm512_min_ps(t, _mm512_set1_ps(6.0f)),
                                 _mm512_set1_ps(16.0f / 6.0f));  // segments from 0, in [0, 16]
  const __m512i i = _mm512_min_epi32(_mm512_cvttps_epi32(s), _mm512_set1_epi32(15));
  const __m512 u = _mm512_sub_ps(s, _mm512_cvtepi32_ps(i));  // in [0, 1]
  __m512 q = _mm512_permutexvar_ps(i, _mm512_load_ps(GELU_TABLE[5]));
  for (int k = 4; k >= 0; --k)
    q = _mm512_fmadd_ps(q, u, _mm512_permutexvar_ps(i, _mm512_load_ps(GELU_TABLE[k])));
  // Past the table Phi(-|x|) counts as 0: else |x| Phi(-6) would grow with |x|.
  q = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(t, _mm512_set1_ps(6.0f), _CMP_LT_OQ), q);
  const __m512 g = _mm512_fnmadd_ps(t, q, _mm512_max_ps(x, _mm512_setzero_ps()));
  return _mm512_add_ps(g, _mm512_sub_ps(x, x));
}

// One tile: R rows of x (rows `lda` floats apart) times one panel (K, 64), then the epilogue
// (bias, activation, residual) on the accumulators, stored to `out` (rows `ldc` apart).
template <int R>
void tile(const float* x, int64_t lda, const float* panel, int64_t K, const float* bias,
          int64_t activation, const float* residual, int64_t ldr, float* out, int64_t ldc) {
  __m512 acc[R][VECTORS];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < VECTORS; ++v) acc[r][v] = _mm512_setzero_ps();
  const float* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = x + r * lda;
  const float* w = panel;
  for (int64_t k = 0; k < K; ++k) {
    __m512 wv[VECTORS];
    for (int v = 0; v < VECTORS; ++v) {
      wv[v] = _mm512_loadu_ps(w + 16 * v);
      // An address, not a pointer: past the last panel it points outside the weight, which
      // a prefetch may (it never faults) but pointer arithmetic may not.
      const auto ahead = reinterpret_cast<std::uintptr_t>(w) + (PREFETCH * PANEL + 16 * v) * sizeof(float);
      _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T0);
    }
    w += PANEL;
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_set1_ps(rows[r][k]);
      for (int v = 0; v < VECTORS; ++v) acc[r][v] = _mm512_fmadd_ps(xv, wv[v], acc[r][v]);
    }
  }
  for (int v = 0; v < VECTORS; ++v) {
    const __m512 b = bias ? _mm512_loadu_ps(bias + 16 * v) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      __m512 y = _mm512_add_ps(acc[r][v], b);
      if (activation == GELU) y = gelu(y);
      else if (activation == RELU) y = _mm512_max_ps(y, _mm512_setzero_ps());
      if (residual) y = _mm512_add_ps(y, _mm512_loadu_ps(residual + r * ldr + 16 * v));
      _mm512_storeu_ps(out + r * ldc + 16 * v, y);
    }
  }
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, const float*, int64_t,
                        const float*, int64_t, float*, int64_t);

template <int... Rs>
constexpr auto tile_table(std::integer_sequence<int, Rs...>) {
  return std::array<TileFn, sizeof...(Rs)>{&tile<Rs + 1>...};
}

// tiles[R - 1]: the tile of R rows (the last rows of x, when M is not a multiple of 6).
constexpr auto tiles = tile_table(std::make_integer_sequence<int, TILE_ROWS>{});

// LayerNorm of one row of n floats in place (n a multiple of 16), as torch.nn.LayerNorm
// computes it: the mean, then the biased variance of the centred values.
void layer_norm_row(float* y, int64_t n, const float* weight, const float* bias, float eps) {
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) sum = _mm512_add_ps(sum, _mm512_loadu_ps(y + j));
  const __m512 mean = _mm512_set1_ps(_mm512_reduce_add_ps(sum) / static_cast<float>(n));
  __m512 squares = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(y + j), mean);
    squares = _mm512_fmadd_ps(d, d, squares);
  }
  const float variance = _mm512_reduce_add_ps(squares) / static_cast<float>(n);
  const __m512 scale = _mm512_set1_ps(1.0f / std::sqrt(variance + eps));
  for (int64_t j = 0; j < n; j += 16) {
    const __m512 d = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(y + j), mean), scale);
    _mm512_storeu_ps(y + j, _mm512_fmadd_ps(d, _mm512_loadu_ps(weight + j),
                                            _mm512_loadu_ps(bias + j)));
  }
}

const float* optional_vector(const c10::optional<at::Tensor>& t, int64_t n, const char* name) {
  if (!t.has_value() || !t->defined()) return nullptr;
  TORCH_CHECK(t->dim() == 1 && t->size(0) == n && t->is_contiguous() &&
                  t->scalar_type() == at::kFloat && t->device().is_cpu(),
              name, " must be a contiguous (", n, ",) float32 CPU tensor");
  return t->data_ptr<float>();
}

// (N, K) -> (N / 64, K, 64): panel p holds columns 64p .. 64p + 63, k by k.
at::Tensor pack_linear_weight(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.device().is_cpu(),
              "weight must be a (N, K) float32 CPU tensor");
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(N % PANEL == 0, "weight rows (out features) must be a multiple of 64, got ", N);
  const auto w = weight.contiguous();
  auto packed = at::empty({N / PANEL, K, PANEL}, w.options());
  const float* src = w.data_ptr<float>();
  float* dst = packed.data_ptr<float>();
  at::parallel_for(0, N / PANEL, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      for (int64_t c = 0; c < PANEL; ++c)
        for (int64_t k = 0; k < K; ++k) dst[(p * K + k) * PANEL + c] = src[(p * PANEL + c) * K + k];
  });
  return packed;
}

// x (M, K) with unit column stride; packed from pack_linear_weight (N / 64, K, 64); bias (N,)
// or None; activation NONE / RELU / GELU; residual (M, N) with unit column stride or None;
// norm_weight and norm_bias (N,) both or neither (then eps is unused). Returns (M, N).
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed,
                  const c10::optional<at::Tensor>& bias, int64_t activation,
                  const c10::optional<at::Tensor>& residual,
                  const c10::optional<at::Tensor>& norm_weight,
                  const c10::optional<at::Tensor>& norm_bias, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu() &&
                  x.stride(1) == 1,
              "x must be a (M, K) float32 CPU tensor with unit column stride");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == PANEL && packed.is_contiguous() &&
                  packed.scalar_type() == at::kFloat,
              "packed must come from pack_linear_weight");
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0) * PANEL;
  TORCH_CHECK(packed.size(1) == K, "x has ", K, " features, the weight ", packed.size(1));
  TORCH_CHECK(activation == NONE || activation == RELU || activation == GELU,
              "activation must be 0 (none), 1 (relu) or 2 (gelu), got ", activation);
  const float* b = optional_vector(bias, N, "bias");
  const float* norm_w = optional_vector(norm_weight, N, "norm_weight");
  const float* norm_b = optional_vector(norm_bias, N, "norm_bias");
  TORCH_CHECK((norm_w == nullptr) == (norm_b == nullptr),
              "norm_weight and norm_bias come together");
  const float* res = nullptr;
  int64_t ldr = 0;
  if (residual.has_value() && residual->defined()) {
    TORCH_CHECK(residual->dim() == 2 && residual->size(0) == M && residual->size(1) == N &&
                    residual->stride(1) == 1 && residual->scalar_type() == at::kFloat &&
                    residual->device().is_cpu(),
                "residual must be a (M, N) float32 CPU tensor with unit column stride");
    res = residual->data_ptr<float>();
    ldr = residual->stride(0);
  }
  auto out = at::empty({M, N}, x.options());
  if (M == 0) return out;
  const float* xp = x.data_ptr<float>();
  const int64_t lda = x.stride(0);
  const float* wp = packed.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t tiles_down = (M + TILE_ROWS - 1) / TILE_ROWS, panels = N / PANEL;
  const float epsilon = static_cast<float>(eps);
  // The product of the row tile starting at row i against panel p, its epilogue but the norm.
  const auto product = [&](int64_t i, int64_t p) {
    const int64_t rows = std::min<int64_t>(TILE_ROWS, M - i);
    tiles[rows - 1](xp + i * lda, lda, wp + p * K * PANEL, K, b ? b + p * PANEL : nullptr,
                    activation, res ? res + i * ldr + p * PANEL : nullptr, ldr,
                    op + i * N + p * PANEL, N);
  };
  if (M <= FEW_ROWS || tiles_down < at::get_num_threads()) {  // each panel streamed once
    at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p)
        for (int64_t i = 0; i < M; i += TILE_ROWS) product(i, p);
    });
    if (norm_w)  // after every panel: the few rows are whole now
      for (int64_t r = 0; r < M; ++r) layer_norm_row(op + r * N, N, norm_w, norm_b, epsilon);
    return out;
  }
  at::parallel_for(0, tiles_down, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i = t * TILE_ROWS, rows = std::min<int64_t>(TILE_ROWS, M - i);
      for (int64_t p = 0; p < panels; ++p) product(i, p);
      if (norm_w)  // the tile row's output rows are whole and still in cache
        for (int64_t r = i; r < i + rows; ++r) layer_norm_row(op + r * N, N, norm_w, norm_b, epsilon);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(clearformer_avx512, m) {
  m.def("pack_linear_weight(Tensor weight) -> Tensor");
  m.def(
      "linear(Tensor x, Tensor packed, Tensor? bias, int activation, Tensor? residual, "
      "Tensor? norm_weight, Tensor? norm_bias, float eps) -> Tensor");
}
TORCH_LIBRARY_IMPL(clearformer_avx512, CPU, m) {
  m.impl("pack_linear_weight", &pack_linear_weight);
  m.impl("linear", &linear);
}
