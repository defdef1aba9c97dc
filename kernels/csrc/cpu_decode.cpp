// The float32 CPU kernels of decode steps (a few rows): few_row_linear, y[M, N] =
// x[M, K] @ w[N, K]^T (w float32, or bfloat16 read as its exact float32 values;
// few_row_linear_int8 reads int8 blocks whose exact float32 values w holds; or 4-bit
// blocks, kQ4BlockBytes bytes per 32 weights, whose exact float32 values w holds), and
// rms_norm_rows, for M <= 8; llama_layer_rows, a whole Llama decoder layer, and
// eagle3_layer_rows, an EAGLE-3 head's first layer (both from layer_from_qkv), which an
// EAGLE-3 head's catch-up (eagle3_catch_up_rows) and drafts (eagle3_draft_rows) run.
//
// Why: a decode step reads every weight once for one row (plain decoding) or a few
// (verification). MKL's paths for these shapes stream the weights at 15-20 GB/s on the
// 2-core development machine, where a sum over 256 MiB reads at 28-35 GB/s
// (kernels/README.md); a row-major dot product per output, the weight row read once for
// all M input rows, reaches ~31 GB/s. No column-major weight copies are needed.
//
// Batch invariance: y[m, n] is one dot product of x[m] and w[n], computed by the same
// instructions whatever M is and whichever thread runs it, so a row gets the same bits
// alone (plain decoding) as inside a verification step.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

// Horizontal sum of one 8-wide accumulator in a fixed order.
inline float hsum8(__m256 v) {
  alignas(32) float l[8];
  _mm256_store_ps(l, v);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

// Eight weights as float32: a float32 weight as it is, a bfloat16 one widened (its 16
// bits become the float's upper half: exact). A bfloat16 weight gives the products and sums
// of its float32 copy, bit for bit, from half the bytes.
inline __m256 load_weights8(const float* w) { return _mm256_loadu_ps(w); }
inline __m256 load_weights8(const at::BFloat16* w) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
inline float weight_value(float w) { return w; }
inline float weight_value(at::BFloat16 w) { return static_cast<float>(w); }

// How far ahead of its loads a dot product asks for the weights: software prefetches into
// L1 and, further ahead, into L2 (the weight rows lie one after another, so near a row's
// end they fetch the next rows). The hardware prefetchers alone keep the one-row dot
// products of plain decoding streaming, but not the three-row ones of a verification,
// whose arithmetic per byte is three times as much. On the 2-core development machine,
// `python -m eagle_zoo.kernels.cpu_decode --bench` (BENCHMARKS.md, "Decided by measurement"): a
// three-row layer of SmolLM2's products took about 0.5 ms without them, about 0.35 ms
// with the L1 one alone and about 0.25 ms with both, as long as a one-row layer. The
// bits do not change.
constexpr int64_t kPrefetchL1Bytes = 1024;
constexpr int64_t kPrefetchL2Bytes = 4096;

inline void prefetch_ahead(const void* p) {
  _mm_prefetch(static_cast<const char*>(p) + kPrefetchL1Bytes, _MM_HINT_T0);
  _mm_prefetch(static_cast<const char*>(p) + kPrefetchL2Bytes, _MM_HINT_T2);
}

// One block of 32 weights, b[0..3] as float32, against R input rows: s[r][i] += a[r][k + 8i
// .. k + 8i + 8) * b[i], dot_rows' order, which every weight format's dot products share.
template <int R>
inline void add_block32(const float* const* a, int64_t k, const __m256 (&b)[4], __m256 (&s)[R][4]) {
  for (int r = 0; r < R; ++r) {
    s[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + k), b[0], s[r][0]);
    s[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + k + 8), b[1], s[r][1]);
    s[r][2] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + k + 16), b[2], s[r][2]);
    s[r][3] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + k + 24), b[3], s[r][3]);
  }
}

// Dot products of R rows a[r] with the same weight row b over K: per row four 8-wide fp32
// accumulators over blocks of 32, one over the remaining blocks of 8, then a fixed-order
// horizontal sum and the scalar tail. b's vectors are loaded once for the R rows
// (verification steps are bound by these loads, not by memory), and every row runs the
// same arithmetic whatever R is, so a row's bits do not depend on its neighbours. Its 4R
// accumulators and four b vectors fit AVX2's sixteen registers for R <= 3, and the 32 of
// AVX-512VL for R = 4 (kFloatGroup).
template <int R, typename W>
inline void dot_rows(const float* const* a, const W* b, int64_t K, float* const* out) {
  __m256 s[R][4];
  for (int r = 0; r < R; ++r) s[r][0] = s[r][1] = s[r][2] = s[r][3] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    prefetch_ahead(b + k);  // 32 weights: one 64-byte line of bfloat16, two of float32
    if (sizeof(W) == 4) prefetch_ahead(b + k + 16);
    const __m256 w[4] = {load_weights8(b + k), load_weights8(b + k + 8), load_weights8(b + k + 16),
                         load_weights8(b + k + 24)};
    add_block32<R>(a, k, w, s);
  }
  for (; k + 8 <= K; k += 8) {
    const __m256 b0 = load_weights8(b + k);
    for (int r = 0; r < R; ++r) s[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + k), b0, s[r][0]);
  }
  const int64_t tail = k;
  for (int r = 0; r < R; ++r) {
    float total = hsum8(_mm256_add_ps(_mm256_add_ps(s[r][0], s[r][1]), _mm256_add_ps(s[r][2], s[r][3])));
    for (k = tail; k < K; ++k) total += a[r][k] * weight_value(b[k]);
    *out[r] = total;
  }
}

// The rows few_row_linear takes in one pass over a weight row: four (a k = 3
// verification) where the build has AVX-512VL's 32 vector registers, else three, since
// four rows' 16 accumulators spill from AVX2's 16 and the spills cost more than the
// second pass saves. Measured with `python -m eagle_zoo.kernels.cpu_decode --against REV`
// (BENCHMARKS.md, "Decided by measurement").
#ifdef __AVX512VL__
constexpr int kFloatGroup = 4;
#else
constexpr int kFloatGroup = 3;
#endif

inline float dot(const float* a, const float* b, int64_t K) {
  float total;
  float* out = &total;
  dot_rows<1>(&a, b, K, &out);
  return total;
}

// e^x, 8 lanes: x = n ln2 + r with |r| <= ln2 / 2, e^r by its degree-6 polynomial
// (Cephes expf's coefficients, within about 1 ulp), times 2^n built in the exponent bits.
// x is first clamped to [-87.3, 88.3], where e^x is a normal float: below, the result is
// ~1e-38 (nothing in a softmax sum or a sigmoid), above, ~2e38 instead of infinity.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// The softmax probability of the largest of n logits l (its value max): 1 / sum e^(l - max).
inline float top_probability(const float* l, int64_t n, float max) {
  const __m256 m = _mm256_set1_ps(max);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, exp8(_mm256_sub_ps(_mm256_loadu_ps(l + i), m)));
  float sum = hsum8(acc);
  for (; i < n; ++i) sum += std::exp(l[i] - max);
  return 1.0f / sum;
}

// r[j] = the sum of a[j]'s lanes, j = 0..7, in a fixed order: eight keys' scores at once.
inline __m256 transpose_sum8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// A weight of 4-bit blocks (a GGUF Q4_1 tensor's exact form, models/layers.py
// add_exact_q4_copies): per row, for each 32 inputs, 16 bytes of 4-bit q (byte j: q[j] in
// its low half, q[j + 16] in its high half), then d and m as float32; the weight's
// values are q * d + m. Stored as uint8 [N, K / 32 * kQ4BlockBytes].
constexpr int64_t kQ4BlockBytes = 24;

bool is_q4(const torch::Tensor& w) { return w.scalar_type() == torch::kByte; }

// The inputs a weight [N, ...] multiplies: its last dimension, or a 4-bit weight's blocks
// times 32.
int64_t in_features(const torch::Tensor& w) {
  const int64_t last = w.size(w.dim() - 1);
  return is_q4(w) ? last / kQ4BlockBytes * 32 : last;
}

// The checks both entry points make: CPU tensors, contiguous, at most 8 rows of float32
// x [M, K] and a weight whose last dimension is K, float32 (or, where packed_weight is
// allowed, bfloat16 or 4-bit blocks over K).
void check_rows(const char* fn, const torch::Tensor& x, const torch::Tensor& w, int64_t w_dim,
                bool packed_weight = false) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), fn, ": CPU tensors only");
  TORCH_CHECK(x.scalar_type() == torch::kFloat && (w.scalar_type() == torch::kFloat ||
                                                   (packed_weight && (w.scalar_type() == torch::kBFloat16 || is_q4(w)))),
              fn, ": float32 x and a float32", packed_weight ? ", bfloat16 or 4-bit (uint8)" : "",
              " weight only, got ", x.scalar_type(), " and ", w.scalar_type());
  TORCH_CHECK(x.dim() == 2 && w.dim() == w_dim && x.size(1) == in_features(w) &&
              (!is_q4(w) || w.size(w_dim - 1) % kQ4BlockBytes == 0),
              fn, ": x [M, K] and w [", w_dim == 2 ? "N, K" : "K", is_q4(w) ? " / 32 blocks" : "", "], got ",
              x.sizes(), " and ", w.sizes());
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), fn, ": contiguous x and w");
  TORCH_CHECK(x.size(0) <= 8, fn, ": at most 8 rows, got ", x.size(0));
}

// y [M, N] = x [M, K] times N weight rows: dot(rows, a, n, y) writes weight row n's dot
// products with the `rows` input rows a (a std::integral_constant: groups of Group rows,
// then 2 or 1) to y. Outputs split over torch's threads; 64 outputs at least per chunk
// (the layers are 192 to 49,152 wide), each weight row read once for the M dot products.
template <int Group, typename Dot>
void rows_times_weights(const float* xp, float* yp, int64_t M, int64_t K, int64_t N, Dot dot) {
  static_assert(Group == 3 || Group == 4, "groups of 3 or 4 rows");
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      int64_t m = 0;
      auto next = [&](auto rows) {  // weight row n against input rows m .. m + rows - 1
        constexpr int R = decltype(rows)::value;
        const float* a[R];
        float* y[R];
        for (int r = 0; r < R; ++r) a[r] = xp + (m + r) * K, y[r] = yp + (m + r) * N + n;
        dot(rows, a, n, y);
        m += R;
      };
      while (m + Group <= M) next(std::integral_constant<int, Group>());
      if (Group == 4 && m + 3 <= M) next(std::integral_constant<int, 3>());
      if (m + 2 <= M) next(std::integral_constant<int, 2>());
      if (m < M) next(std::integral_constant<int, 1>());
    }
  });
}

// Dot products as dot_rows', for a weight stored as int8 blocks of 32 with a float32 scale
// each, whose float32 values are exactly q * d (checked when the copy is made,
// models/layers.py add_exact_int8_copies): the same products and sums in the same order,
// bit for bit, from a quarter of the bytes. K is a multiple of 32.
template <int R>
inline void dot_rows_int8(const float* const* a, const int8_t* q, const float* d, int64_t K, float* const* out) {
  __m256 s[R][4];
  for (int r = 0; r < R; ++r) s[r][0] = s[r][1] = s[r][2] = s[r][3] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {
    prefetch_ahead(q + k);
    const __m256 scale = _mm256_set1_ps(d[k / 32]);
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + k));
    const __m128i lo = _mm256_castsi256_si128(bytes), hi = _mm256_extracti128_si256(bytes, 1);
    auto values8 = [&](__m128i v) {  // the low 8 bytes of v, each an int8 q, as q * d
      return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), scale);
    };
    const __m256 w[4] = {values8(lo), values8(_mm_srli_si128(lo, 8)), values8(hi), values8(_mm_srli_si128(hi, 8))};
    add_block32<R>(a, k, w, s);
  }
  for (int r = 0; r < R; ++r)
    *out[r] = hsum8(_mm256_add_ps(_mm256_add_ps(s[r][0], s[r][1]), _mm256_add_ps(s[r][2], s[r][3])));
}

// Dot products as dot_rows', for a weight of 4-bit blocks (kQ4BlockBytes each) whose
// float32 values are exactly q * d + m (checked when the copy is made, models/layers.py
// add_exact_q4_copies; q * d is exact, a 4-bit integer times a float16 value, so one
// rounding whether or not the compiler fuses it with the add): the same products and sums
// in the same order as dot_rows over the float32 weight, bit for bit, from 3/16 of the
// bytes. K is a multiple of 32.
template <int R>
inline void dot_rows_q4(const float* const* a, const uint8_t* w, int64_t K, float* const* out) {
  __m256 s[R][4];
  for (int r = 0; r < R; ++r) s[r][0] = s[r][1] = s[r][2] = s[r][3] = _mm256_setzero_ps();
  const __m128i low_half = _mm_set1_epi8(0x0F);
  for (int64_t k = 0; k < K; k += 32, w += kQ4BlockBytes) {
    prefetch_ahead(w);
    float dm[2];
    std::memcpy(dm, w + 16, sizeof(dm));
    const __m256 d = _mm256_set1_ps(dm[0]), m = _mm256_set1_ps(dm[1]);
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
    const __m128i lo = _mm_and_si128(bytes, low_half), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low_half);
    auto values8 = [&](__m128i q) {  // the low 8 bytes of q, each a 4-bit q, as q * d + m
      return _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), d), m);
    };
    const __m256 w[4] = {values8(lo), values8(_mm_srli_si128(lo, 8)), values8(hi), values8(_mm_srli_si128(hi, 8))};
    add_block32<R>(a, k, w, s);
  }
  for (int r = 0; r < R; ++r)
    *out[r] = hsum8(_mm256_add_ps(_mm256_add_ps(s[r][0], s[r][1]), _mm256_add_ps(s[r][2], s[r][3])));
}

}  // namespace

torch::Tensor few_row_linear(const torch::Tensor& x, const torch::Tensor& w) {
  check_rows("few_row_linear", x, w, 2, /*packed_weight=*/true);
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  auto y = torch::empty({M, N}, x.options());
  auto times = [&](const auto* wp) {
    rows_times_weights<kFloatGroup>(x.data_ptr<float>(), y.data_ptr<float>(), M, K, N,
                          [&](auto rows, const float* const* a, int64_t n, float* const* out) {
                            dot_rows<decltype(rows)::value>(a, wp + n * K, K, out);
                          });
  };
  if (is_q4(w)) {
    const uint8_t* wp = w.data_ptr<uint8_t>();
    const int64_t row_bytes = w.size(1);
    // Groups of four rows on any build, as the int8 weights' (few_row_linear_int8).
    rows_times_weights<4>(x.data_ptr<float>(), y.data_ptr<float>(), M, K, N,
                          [&](auto rows, const float* const* a, int64_t n, float* const* out) {
                            dot_rows_q4<decltype(rows)::value>(a, wp + n * row_bytes, K, out);
                          });
  } else if (w.scalar_type() == torch::kBFloat16) {
    times(w.data_ptr<at::BFloat16>());
  } else {
    times(w.data_ptr<float>());
  }
  return y;
}

// y [M, N] = x [M, K] @ (q [N, K] * d [N, K / 32] per block of 32)^T: few_row_linear of
// the float32 weight whose exact int8 copy (q, d) this is, same bits (dot_rows_int8).
torch::Tensor few_row_linear_int8(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& d) {
  TORCH_CHECK(x.device().is_cpu() && q.device().is_cpu() && d.device().is_cpu(), "few_row_linear_int8: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == torch::kFloat && x.dim() == 2 && x.is_contiguous() && x.size(0) <= 8,
              "few_row_linear_int8: contiguous float32 x [M <= 8, K], got ", x.scalar_type(), " ", x.sizes());
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
  TORCH_CHECK(q.scalar_type() == torch::kChar && q.dim() == 2 && q.size(1) == K && q.is_contiguous() && K % 32 == 0,
              "few_row_linear_int8: contiguous int8 q [N, K] with K = ", K, " a multiple of 32, got ", q.sizes());
  TORCH_CHECK(d.scalar_type() == torch::kFloat && d.dim() == 2 && d.size(0) == N && d.size(1) == K / 32 &&
              d.is_contiguous(), "few_row_linear_int8: contiguous float32 d [", N, ", ", K / 32, "], got ", d.sizes());
  auto y = torch::empty({M, N}, x.options());
  const int8_t* qp = q.data_ptr<int8_t>();
  const float* dp = d.data_ptr<float>();
  // Groups of four rows (a k = 3 verification in one group) on any build: here the
  // weights' dequantization is much of the arithmetic, so doing it once for four rows
  // beats 3 + 1 (the lm_head at 4 rows: ~2.9 -> ~2.2 ms, BENCHMARKS.md `make demo`, the
  // products' bench) even where four rows' 16 accumulators spill from AVX2's 16 registers.
  rows_times_weights<4>(x.data_ptr<float>(), y.data_ptr<float>(), M, K, N,
                        [&](auto rows, const float* const* a, int64_t n, float* const* out) {
                          dot_rows_int8<decltype(rows)::value>(a, qp + n * K, dp + n * (K / 32), K, out);
                        });
  return y;
}

// w [N, K] float32 as 4-bit blocks (kQ4BlockBytes per 32 values, dot_rows_q4's layout) with
// q * d + m == w exactly, block by block, or an empty tensor where a block is not: m the
// block's least value (a float16 value), d its range over 15 rounded to float16, q the
// nearest integers (ties to even) of (w - m) / d, or 0 where d is 0; the same test and
// packing as models/layers.py exact_q4_blocks_torch, in one pass (the engine checks every
// float32 weight of a model it loads on the CPU).
torch::Tensor q4_blocks(const torch::Tensor& w) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == torch::kFloat && w.dim() == 2 && w.is_contiguous() &&
              w.size(1) % 32 == 0, "q4_blocks: a contiguous float32 CPU weight [N, K], K a multiple of 32, got ",
              w.scalar_type(), " ", w.sizes());
  const int64_t N = w.size(0), blocks = w.size(1) / 32;
  auto out = torch::empty({N, blocks * kQ4BlockBytes}, w.options().dtype(torch::kByte));
  const float* wp = w.data_ptr<float>();
  uint8_t* op = out.data_ptr<uint8_t>();
  std::atomic<bool> exact{true};
  auto half = [](float x) { return static_cast<float>(c10::Half(x)); };
  at::parallel_for(0, N * blocks, 256, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end && exact.load(std::memory_order_relaxed); ++b) {
      const float* x = wp + b * 32;
      float lo = x[0], hi = x[0];
      for (int j = 1; j < 32; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
      const float m = lo, d = half((hi - lo) / 15.f), divisor = d > 0.f ? d : 1.f;
      uint8_t q[32];
      bool ok = half(m) == m;
      for (int j = 0; j < 32 && ok; ++j) {
        const float v = std::min(std::max(std::nearbyint((x[j] - m) / divisor), 0.f), 15.f);
        const float product = v * d;  // exact: a 4-bit integer times a float16 value
        ok = product + m == x[j];
        q[j] = static_cast<uint8_t>(v);
      }
      if (!ok) {
        exact.store(false, std::memory_order_relaxed);
        return;
      }
      uint8_t* block = op + b * kQ4BlockBytes;
      for (int j = 0; j < 16; ++j) block[j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
      std::memcpy(block + 16, &d, sizeof(float));
      std::memcpy(block + 20, &m, sizeof(float));
    }
  });
  return exact.load() ? out : torch::empty({0}, w.options().dtype(torch::kByte));
}

// RMSNorm of each row: y = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps), the order of
// operations of kernels/norm.py's reference (not its bits: another summation order).
// A decode step runs 61 of them for SmolLM2; torch's F.rms_norm is several internal ops
// each (adding this kernel took a CPU step's non-matmul time from ~17 to ~12 ms,
// BENCHMARKS.md, CPU). One thread: a row is a few hundred to a few thousand floats.
torch::Tensor rms_norm_rows(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  check_rows("rms_norm_rows", x, w, 1);
  const int64_t M = x.size(0), N = x.size(1);
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    const float* row = xp + m * N;
    const float rstd = 1.0f / std::sqrt(dot(row, row, N) / static_cast<float>(N) + static_cast<float>(eps));
    const __m256 r = _mm256_set1_ps(rstd);
    float* out = yp + m * N;
    int64_t i = 0;
    for (; i + 8 <= N; i += 8) {
      _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(wp + i), _mm256_mul_ps(_mm256_loadu_ps(row + i), r)));
    }
    for (; i < N; ++i) out[i] = wp[i] * (row[i] * rstd);
  }
  return y;
}

namespace {

// out[0 .. 8 NV) += sum over j < n of p[j] * values[j * stride + 0 .. 8 NV), in key order,
// in NV accumulators held in registers; an element's arithmetic is the same whatever NV
// is and wherever a caller cuts the keys into blocks.
template <int NV>
inline void add_weighted_values(const float* p, int64_t n, const float* values, int64_t stride, float* out) {
  __m256 o[NV];
  for (int i = 0; i < NV; ++i) o[i] = _mm256_loadu_ps(out + 8 * i);
  for (int64_t j = 0; j < n; ++j) {
    const __m256 pj = _mm256_set1_ps(p[j]);
    const float* row = values + j * stride;
    for (int i = 0; i < NV; ++i) o[i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(row + 8 * i), o[i]);
  }
  for (int i = 0; i < NV; ++i) _mm256_storeu_ps(out + 8 * i, o[i]);
}

// Keys per split of cache_attention_rows (a multiple of 8): the splits are the work items
// shared out over threads, so a single sequence's attention uses every core.
constexpr int64_t kKeysPerSplit = 256;
// How far ahead of its scores a split asks for a key (into L1); each block of keys also
// asks for its values (into L2) for the values' pass after the scores. A decode step
// streams the layers' weights through the caches, so a layer's cache rows come from
// memory, where one thread would otherwise wait for each key's lines in turn
// (BENCHMARKS.md, "Decided by measurement": CPU attention).
constexpr int64_t kKeysAhead = 16;

// Asks for one kv head's d floats of a cache row, a 64-byte line (16 floats) at a time.
template <int Hint>
inline void prefetch_head(const float* p, int64_t d) {
  for (int64_t i = 0; i < d; i += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(p + i), static_cast<decltype(_MM_HINT_T0)>(Hint));
  }
}
// Keys whose values every query of a split weighs before the next block's are read: 32
// keys of a 64-float head are 8 KiB, which stay in L1 while each query reads them.
constexpr int64_t kValueBlock = 32;

// Causal attention over one cache row for T tokens, GQA: query head h of token t attends
// to keys [0, min(pos[t] + 1, kv_len)) of kv head h / group. Token t's query heads are at
// qkv + t * row (already roped); out [T, num_heads * d]; d a multiple of 8.
//
// Flash-decoding on the CPU: the keys are cut into fixed splits of kKeysPerSplit, and
// each (kv head, split) is one work item over torch's threads. An item takes every query
// of its kv head (its group of query heads, of every token) at once, so it reads the
// head's keys and values once for all of them: scores eight keys at a time (one
// accumulator per key over d, then transpose_sum8), then per query the max, exp (exp8)
// and sum, then the values weighted in blocks of kValueBlock keys. The splits of a query
// are merged in split order. A query's arithmetic is the same whatever T is (its splits
// and the keys it sees in each depend only on its own position), so a row's bits do not
// depend on T or on the other rows.
void cache_attention_rows(const float* qkv, int64_t row, const float* k_rows, const float* v_rows,
                          int64_t kv_width, const int64_t* pos, int64_t T, int64_t kv_len, int64_t num_heads,
                          int64_t num_kv_heads, int64_t d, float scale, float* out) {
  const int64_t group = num_heads / num_kv_heads, nq = T * group, q_width = num_heads * d, dv = d / 8;
  std::vector<int64_t> limit(T);
  int64_t max_keys = 0;
  for (int64_t t = 0; t < T; ++t) {
    limit[t] = std::min(pos[t] + 1, kv_len);
    max_keys = std::max(max_keys, limit[t]);
  }
  const int64_t splits = (max_keys + kKeysPerSplit - 1) / kKeysPerSplit;
  const int64_t part = 2 + d;  // a query's split: max, sum, unnormalised output
  std::vector<float> partial(static_cast<size_t>(std::max<int64_t>(num_kv_heads * splits * nq * part, 1)));
  auto query = [&](int64_t kvh, int64_t qi) { return qkv + (qi / group) * row + (kvh * group + qi % group) * d; };

  auto one_split = [&](int64_t item) {
    const int64_t kvh = item / splits, j0 = (item % splits) * kKeysPerSplit;
    const int64_t j1 = std::min(j0 + kKeysPerSplit, max_keys);
    const float* k_head = k_rows + j0 * kv_width + kvh * d;  // key j0 of this kv head
    const float* v_head = v_rows + j0 * kv_width + kvh * d;
    std::vector<float> scores(static_cast<size_t>(nq * kKeysPerSplit));
    std::vector<float> pad(static_cast<size_t>(8 * d), 0.f);  // a last block of under 8 keys, zero-padded
    for (int64_t jb = 0; jb < j1 - j0; jb += 8) {
      for (int64_t i = 0; i < 8 && jb + i < j1 - j0; ++i) {
        if (jb + kKeysAhead + i < j1 - j0) prefetch_head<_MM_HINT_T0>(k_head + (jb + kKeysAhead + i) * kv_width, d);
        prefetch_head<_MM_HINT_T1>(v_head + (jb + i) * kv_width, d);
      }
      const float* keys[8];
      for (int64_t i = 0; i < 8; ++i) {
        if (j0 + jb + 8 <= j1) {
          keys[i] = k_head + (jb + i) * kv_width;
        } else {
          if (j0 + jb + i < j1) std::memcpy(pad.data() + i * d, k_head + (jb + i) * kv_width, d * sizeof(float));
          keys[i] = pad.data() + i * d;
        }
      }
      for (int64_t qi = 0; qi < nq; ++qi) {
        const float* q = query(kvh, qi);
        __m256 acc[8];
        for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
        for (int64_t v = 0; v < dv; ++v) {
          const __m256 qv = _mm256_loadu_ps(q + 8 * v);
          for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys[i] + 8 * v), acc[i]);
        }
        _mm256_storeu_ps(scores.data() + qi * kKeysPerSplit + jb, _mm256_mul_ps(transpose_sum8(acc),
                                                                                 _mm256_set1_ps(scale)));
      }
    }
    std::vector<int64_t> seen(nq);  // keys each query sees in this split
    for (int64_t qi = 0; qi < nq; ++qi) {
      float* result = partial.data() + (item * nq + qi) * part;
      const int64_t n = seen[qi] = std::max<int64_t>(std::min(limit[qi / group], j1) - j0, 0);
      result[0] = -INFINITY;  // a query that sees no key here: an empty split
      if (n == 0) continue;
      float* sc = scores.data() + qi * kKeysPerSplit;
      float m = -INFINITY;
      for (int64_t j = 0; j < n; ++j) m = std::max(m, sc[j]);
      __m256 sum = _mm256_setzero_ps();
      for (int64_t j = 0; j < n; j += 8) {  // sc has room for whole blocks of 8
        __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + j), _mm256_set1_ps(m)));
        if (j + 8 > n) {  // lanes past the query's last key count nothing
          alignas(32) int32_t keep[8];
          for (int64_t i = 0; i < 8; ++i) keep[i] = j + i < n ? -1 : 0;
          p = _mm256_and_ps(p, _mm256_castsi256_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(keep))));
        }
        _mm256_storeu_ps(sc + j, p);
        sum = _mm256_add_ps(sum, p);
      }
      result[0] = m;
      result[1] = hsum8(sum);
      std::fill(result + 2, result + part, 0.f);
    }
    for (int64_t jb = 0; jb < j1 - j0; jb += kValueBlock) {
      for (int64_t qi = 0; qi < nq; ++qi) {
        const int64_t n = std::min(seen[qi], jb + kValueBlock) - jb;
        if (n <= 0) continue;
        const float* p = scores.data() + qi * kKeysPerSplit + jb;
        float* o = partial.data() + (item * nq + qi) * part + 2;
        const float* values = v_head + jb * kv_width;
        int64_t v = 0;
        for (; v + 8 <= dv; v += 8) add_weighted_values<8>(p, n, values + 8 * v, kv_width, o + 8 * v);
        for (; v < dv; ++v) add_weighted_values<1>(p, n, values + 8 * v, kv_width, o + 8 * v);
      }
    }
  };
  const int64_t items = num_kv_heads * splits;
  // Items over torch's threads whatever the context: the cache rows come from memory, and
  // two cores' loads beat one's from 60 keys on (BENCHMARKS.md, "Decided by measurement").
  at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) one_split(item);
  });
  // Merge each query's splits in split order (splits past its last key are empty).
  for (int64_t kvh = 0; kvh < num_kv_heads; ++kvh) {
    for (int64_t qi = 0; qi < nq; ++qi) {
      float* o = out + (qi / group) * q_width + (kvh * group + qi % group) * d;
      std::fill(o, o + d, 0.f);
      float m = -INFINITY, l = 0.f;
      for (int64_t s = 0; s < splits; ++s) m = std::max(m, partial[((kvh * splits + s) * nq + qi) * part]);
      if (m == -INFINITY) continue;  // a query that sees no key gets zeros
      for (int64_t s = 0; s < splits; ++s) {
        const float* result = partial.data() + ((kvh * splits + s) * nq + qi) * part;
        if (result[0] == -INFINITY) continue;
        const float w = std::exp(result[0] - m);
        l += w * result[1];
        for (int64_t i = 0; i < d; ++i) o[i] = std::fma(w, result[2 + i], o[i]);
      }
      const float inv = 1.f / l;
      for (int64_t i = 0; i < d; ++i) o[i] *= inv;
    }
  }
}

// The checks both attention entry points (llama_layer_rows, cache_attention) make:
// contiguous float32 caches [slots, len, num_kv_heads, d] of one shape, d a multiple of 8
// (the attention's vectors), query heads a multiple of kv heads, the slot one of the rows,
// kv_len within a row, and int64 cache positions [T].
void check_caches(const char* fn, const torch::Tensor& k_cache, const torch::Tensor& v_cache, int64_t slot,
                  const torch::Tensor& cache_positions, int64_t T, int64_t kv_len, int64_t num_heads,
                  int64_t num_kv_heads) {
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
              k_cache.scalar_type() == torch::kFloat && v_cache.scalar_type() == torch::kFloat &&
              v_cache.sizes() == k_cache.sizes() && k_cache.size(2) == num_kv_heads && k_cache.size(3) % 8 == 0 &&
              num_heads % num_kv_heads == 0,
              fn, ": contiguous float32 caches [slots, len, ", num_kv_heads, " kv heads, d a multiple of 8] for ",
              num_heads, " heads, got ", k_cache.sizes(), " and ", v_cache.sizes());
  TORCH_CHECK(slot >= 0 && slot < k_cache.size(0) && kv_len <= k_cache.size(1), fn, ": slot ", slot, " or kv_len ",
              kv_len, " outside the caches ", k_cache.sizes());
  TORCH_CHECK(cache_positions.scalar_type() == torch::kLong && cache_positions.is_contiguous() &&
              cache_positions.numel() == T, fn, ": cache_positions [T] int64");
}

}  // namespace

namespace {

// A Llama decoder layer from its qkv projection on, for T <= 8 tokens of one sequence:
// neox rope of q and k -> KV-cache write -> causal attention over the cache row -> o_proj
// + residual -> rmsnorm -> gate_up -> silu(gate) * up -> down_proj + residual. The two
// entry points below differ only in what feeds the qkv projection and the residual.
torch::Tensor layer_from_qkv(const char* fn, torch::Tensor qkv, const torch::Tensor& residual,
                             const torch::Tensor& w_o, const torch::Tensor& norm2, double eps2,
                             const torch::Tensor& w_gate_up, const torch::Tensor& w_down, const torch::Tensor& cos,
                             const torch::Tensor& sin, torch::Tensor k_cache, torch::Tensor v_cache, int64_t slot,
                             const torch::Tensor& cache_positions, int64_t kv_len, int64_t num_heads,
                             int64_t num_kv_heads, double scale) {
  const int64_t T = qkv.size(0);
  const int64_t d = k_cache.size(3);
  const int64_t half = d / 2;
  const int64_t max_len = k_cache.size(1);
  const int64_t q_width = num_heads * d, kv_width = num_kv_heads * d;
  float* qkvp = qkv.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const int64_t* pos = cache_positions.data_ptr<int64_t>();
  float* kc = k_cache.data_ptr<float>();
  float* vc = v_cache.data_ptr<float>();
  const int64_t row = qkv.size(1);
  // Rope (the whole-head formula of kernels/rope.py: x1*cos - x2*sin, x2*cos + x1*sin),
  // then every token's k and v into the cache before any query reads it.
  for (int64_t t = 0; t < T; ++t) {
    float* tok = qkvp + t * row;
    const float* c = cp + t * half;
    const float* s = sp + t * half;
    for (int64_t head = 0; head < num_heads + num_kv_heads; ++head) {
      float* x = tok + head * d;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c[i] + x2 * (-s[i]);
        x[i + half] = x2 * c[i] + x1 * s[i];
      }
    }
    TORCH_CHECK(pos[t] >= 0 && pos[t] < max_len, fn, ": cache position ", pos[t], " outside [0, ", max_len, ")");
    const int64_t at = (slot * max_len + pos[t]) * kv_width;
    std::memcpy(kc + at, tok + q_width, kv_width * sizeof(float));
    std::memcpy(vc + at, tok + q_width + kv_width, kv_width * sizeof(float));
  }
  auto attn = torch::empty({T, q_width}, qkv.options());
  cache_attention_rows(qkvp, row, kc + slot * max_len * kv_width, vc + slot * max_len * kv_width, kv_width, pos, T,
                       kv_len, num_heads, num_kv_heads, d, static_cast<float>(scale), attn.data_ptr<float>());
  torch::Tensor h2 = residual + few_row_linear(attn, w_o);
  torch::Tensor gu = few_row_linear(rms_norm_rows(h2, norm2, eps2), w_gate_up);  // [T, 2I]
  const int64_t inter = gu.size(1) / 2;
  auto act = torch::empty({T, inter}, qkv.options());
  const float* gp = gu.data_ptr<float>();
  float* mp = act.data_ptr<float>();
  // silu(gate) * up = gate / (1 + e^-gate) * up, eight at a time (exp8), the rest scalar.
  for (int64_t t = 0; t < T; ++t) {
    const float* gate = gp + t * 2 * inter;
    const float* up = gate + inter;
    float* o = mp + t * inter;
    int64_t i = 0;
    for (; i + 8 <= inter; i += 8) {
      const __m256 g = _mm256_loadu_ps(gate + i);
      const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
      _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e)),
                                            _mm256_loadu_ps(up + i)));
    }
    for (; i < inter; ++i) o[i] = (gate[i] / (1.f + std::exp(-gate[i]))) * up[i];
  }
  return h2 + few_row_linear(act, w_down);
}

// The checks of both layer entry points: caches, angles, and projections of the heads'
// widths for a qkv input of qkv_in floats and a residual of H (w_* float32, bfloat16 or
// 4-bit blocks).
void check_layer(const char* fn, const torch::Tensor& k_cache, const torch::Tensor& v_cache, int64_t slot,
                 const torch::Tensor& cache_positions, int64_t T, int64_t kv_len, int64_t num_heads,
                 int64_t num_kv_heads, const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& w_qkv,
                 const torch::Tensor& w_o, int64_t qkv_in, int64_t H) {
  check_caches(fn, k_cache, v_cache, slot, cache_positions, T, kv_len, num_heads, num_kv_heads);
  const int64_t d = k_cache.size(3), half = d / 2;
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == T * half && sin.numel() == T * half,
              fn, ": cos / sin [T, d/2]");
  const int64_t q_width = num_heads * d, kv_width = num_kv_heads * d;
  TORCH_CHECK(w_qkv.dim() == 2 && w_o.dim() == 2 && w_qkv.size(0) == q_width + 2 * kv_width &&
              in_features(w_qkv) == qkv_in && w_o.size(0) == H && in_features(w_o) == q_width,
              fn, ": w_qkv [", q_width + 2 * kv_width, ", ", qkv_in, "] and w_o [", H, ", ", q_width, "] for ",
              num_heads, " heads, ", num_kv_heads, " kv heads of ", d, ", got ", w_qkv.sizes(), " and ", w_o.sizes());
}

}  // namespace

// One exact Llama decoder layer for T <= 8 tokens of one sequence (plain decoding and
// chain verification), float32 activations: rmsnorm -> qkv -> layer_from_qkv. Why one
// call: the module path runs ~13 torch ops and their Python a layer, ~12 ms a SmolLM2 step
// on the development CPU against ~17 ms of matmuls (BENCHMARKS.md, CPU). Every token row
// goes through the same code whatever T is, so verification gives plain decoding's bits.
// Weights float32, or bfloat16 (an EAGLE head's) or 4-bit blocks (a GGUF Q4_1 target's)
// read as their exact float32 values.
torch::Tensor llama_layer_rows(const torch::Tensor& h, const torch::Tensor& norm1, double eps1,
                               const torch::Tensor& w_qkv, const torch::Tensor& w_o, const torch::Tensor& norm2,
                               double eps2, const torch::Tensor& w_gate_up, const torch::Tensor& w_down,
                               const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor k_cache,
                               torch::Tensor v_cache, int64_t slot, const torch::Tensor& cache_positions,
                               int64_t kv_len, int64_t num_heads, int64_t num_kv_heads, double scale) {
  check_layer("llama_layer_rows", k_cache, v_cache, slot, cache_positions, h.size(0), kv_len, num_heads,
              num_kv_heads, cos, sin, w_qkv, w_o, h.size(1), h.size(1));
  return layer_from_qkv("llama_layer_rows", few_row_linear(rms_norm_rows(h, norm1, eps1), w_qkv), h, w_o, norm2,
                        eps2, w_gate_up, w_down, cos, sin, k_cache, v_cache, slot, cache_positions, kv_len,
                        num_heads, num_kv_heads, scale);
}

// A model's whole stack of exact Llama decoder layers for T <= 8 tokens of one sequence:
// llama_layer_rows for each layer in turn, so the same bits, in one call. Why: between two
// layers' calls, the Python that finds and checks a layer's arguments runs cold, after
// the layer's weights have streamed through the caches (BENCHMARKS.md, "Decided by
// measurement"). weights: per layer norm1, w_qkv, w_o, norm2, w_gate_up, w_down; eps: per
// layer eps1, eps2; one k and v cache per layer. Returns the last layer's output, then the
// input of each layer in `keep` (an EAGLE-3 target's aux hidden states), in keep's order.
std::vector<torch::Tensor> llama_stack_rows(torch::Tensor h, const std::vector<torch::Tensor>& weights,
                                            const std::vector<double>& eps, const std::vector<torch::Tensor>& k_caches,
                                            const std::vector<torch::Tensor>& v_caches, const torch::Tensor& cos,
                                            const torch::Tensor& sin, int64_t slot,
                                            const torch::Tensor& cache_positions, int64_t kv_len, int64_t num_heads,
                                            int64_t num_kv_heads, double scale, const std::vector<int64_t>& keep) {
  const int64_t layers = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == 6 * layers && static_cast<int64_t>(eps.size()) == 2 * layers &&
              static_cast<int64_t>(v_caches.size()) == layers,
              "llama_stack_rows: 6 weights, 2 eps and a k and v cache per layer, got ", weights.size(), ", ",
              eps.size(), ", ", k_caches.size(), " and ", v_caches.size());
  std::vector<torch::Tensor> kept(keep.size());
  for (size_t j = 0; j < keep.size(); ++j)
    TORCH_CHECK(keep[j] >= 0 && keep[j] < layers, "llama_stack_rows: keep ", keep[j], " outside [0, ", layers, ")");
  for (int64_t i = 0; i < layers; ++i) {
    for (size_t j = 0; j < keep.size(); ++j)
      if (keep[j] == i) kept[j] = h;
    const torch::Tensor* w = weights.data() + 6 * i;
    h = llama_layer_rows(h, w[0], eps[2 * i], w[1], w[2], w[3], eps[2 * i + 1], w[4], w[5], cos, sin, k_caches[i],
                         v_caches[i], slot, cache_positions, kv_len, num_heads, num_kv_heads, scale);
  }
  kept.insert(kept.begin(), h);
  return kept;
}

// An EAGLE-3 head's first decoder layer (models/heads.py Eagle3DecoderLayer) for T <= 8
// tokens: qkv of [rmsnorm(embeds), rmsnorm(hidden)] side by side, the residual the raw
// hidden state (or its norm, norm_before_residual), then layer_from_qkv. One call
// instead of the module path's ~15 torch ops, which cost a CPU draft pass more than the
// head's weights do.
torch::Tensor eagle3_layer_rows(const torch::Tensor& embeds, const torch::Tensor& norm_e, double eps_e,
                                const torch::Tensor& hidden, const torch::Tensor& norm_h, double eps_h,
                                bool norm_before_residual, const torch::Tensor& w_qkv, const torch::Tensor& w_o,
                                const torch::Tensor& norm2, double eps2, const torch::Tensor& w_gate_up,
                                const torch::Tensor& w_down, const torch::Tensor& cos, const torch::Tensor& sin,
                                torch::Tensor k_cache, torch::Tensor v_cache, int64_t slot,
                                const torch::Tensor& cache_positions, int64_t kv_len, int64_t num_heads,
                                int64_t num_kv_heads, double scale) {
  TORCH_CHECK(embeds.sizes() == hidden.sizes(), "eagle3_layer_rows: embeds and hidden [T, H] of one shape, got ",
              embeds.sizes(), " and ", hidden.sizes());
  check_layer("eagle3_layer_rows", k_cache, v_cache, slot, cache_positions, hidden.size(0), kv_len, num_heads,
              num_kv_heads, cos, sin, w_qkv, w_o, 2 * hidden.size(1), hidden.size(1));
  torch::Tensor normed_hidden = rms_norm_rows(hidden, norm_h, eps_h);
  torch::Tensor x = torch::cat({rms_norm_rows(embeds, norm_e, eps_e), normed_hidden}, 1);
  const torch::Tensor& residual = norm_before_residual ? normed_hidden : hidden;
  return layer_from_qkv("eagle3_layer_rows", few_row_linear(x, w_qkv), residual, w_o, norm2, eps2, w_gate_up,
                        w_down, cos, sin, k_cache, v_cache, slot, cache_positions, kv_len, num_heads, num_kv_heads,
                        scale);
}

// An EAGLE-3 head's catch-up over T <= 8 verified tokens of one sequence: its features
// fc(aux) (the target's aux residual streams of the tokens, aux [T, H_t] each, side by
// side), the embedding rows of the tokens that follow them (ids [T]; -1, a position past
// the accepted run, a zero row), then eagle3_layer_rows at their positions. The module
// path's calls (combine_hidden_states' fc, the embedding, the layer) in its order, so the
// same bits; one call instead of the runner's and the modules' Python, which cost a CPU
// catch-up about as much as its arithmetic. -> the layer's output [T, H].
torch::Tensor eagle3_catch_up_rows(const std::vector<torch::Tensor>& aux, const torch::Tensor& w_fc,
                                   const torch::Tensor& ids, const torch::Tensor& embed,
                                   const torch::Tensor& norm_e, double eps_e, const torch::Tensor& norm_h,
                                   double eps_h, bool norm_before_residual, const torch::Tensor& w_qkv,
                                   const torch::Tensor& w_o, const torch::Tensor& norm2, double eps2,
                                   const torch::Tensor& w_gate_up, const torch::Tensor& w_down,
                                   const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor k_cache,
                                   torch::Tensor v_cache, int64_t slot, const torch::Tensor& cache_positions,
                                   int64_t kv_len, int64_t num_heads, int64_t num_kv_heads, double scale) {
  TORCH_CHECK(!aux.empty(), "eagle3_catch_up_rows: at least one aux input");
  const int64_t T = aux[0].size(0), H = embed.size(1);
  TORCH_CHECK(ids.scalar_type() == torch::kLong && ids.dim() == 1 && ids.size(0) == T && ids.is_contiguous(),
              "eagle3_catch_up_rows: contiguous int64 ids [", T, "], got ", ids.scalar_type(), " ", ids.sizes());
  TORCH_CHECK(embed.dim() == 2 && embed.scalar_type() == torch::kFloat && embed.is_contiguous(),
              "eagle3_catch_up_rows: a contiguous float32 embedding [V, H], got ", embed.scalar_type(), " ",
              embed.sizes());
  const torch::Tensor hidden = few_row_linear(torch::cat(aux, 1), w_fc);
  TORCH_CHECK(hidden.size(1) == H, "eagle3_catch_up_rows: fc gives ", hidden.size(1), " features, the embedding ",
              H);
  auto embeds = torch::zeros({T, H}, hidden.options());
  const int64_t* id = ids.data_ptr<int64_t>();
  const float* rows = embed.data_ptr<float>();
  float* ep = embeds.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(id[t] >= -1 && id[t] < embed.size(0), "eagle3_catch_up_rows: token id ", id[t],
                " outside the embedding's ", embed.size(0), " rows");
    if (id[t] >= 0) std::memcpy(ep + t * H, rows + id[t] * H, H * sizeof(float));
  }
  return eagle3_layer_rows(embeds, norm_e, eps_e, hidden, norm_h, eps_h, norm_before_residual, w_qkv, w_o, norm2,
                           eps2, w_gate_up, w_down, cos, sin, k_cache, v_cache, slot, cache_positions, kv_len,
                           num_heads, num_kv_heads, scale);
}

// An EAGLE-3 head's K greedy drafts for one sequence from its hidden state h [1, H]: per
// draft the final norm, the lm_head over the draft vocabulary, the first largest logit
// (at::argmax, as the module path takes it) mapped to the target's id (+ d2t), and after
// every draft but the last the token's embedding row through eagle3_layer_rows at the
// next position (cos / sin [K - 1, d/2], cache_positions [K - 1]), writing the head's cache.
// The calls and their order are the module path's (EagleProposer._draft_chain on the
// CPU), so the same bits; one call instead of K passes of Python that cost a CPU step
// more than the head's arithmetic. -> the K target ids, int64.
torch::Tensor eagle3_draft_rows(torch::Tensor h, int64_t k, const torch::Tensor& embed, const torch::Tensor& norm_f,
                                double eps_f, const torch::Tensor& lm_head, const torch::Tensor& d2t,
                                const torch::Tensor& norm_e, double eps_e, const torch::Tensor& norm_h,
                                double eps_h, bool norm_before_residual, const torch::Tensor& w_qkv,
                                const torch::Tensor& w_o, const torch::Tensor& norm2, double eps2,
                                const torch::Tensor& w_gate_up, const torch::Tensor& w_down, const torch::Tensor& cos,
                                const torch::Tensor& sin, torch::Tensor k_cache, torch::Tensor v_cache, int64_t slot,
                                const torch::Tensor& cache_positions, int64_t kv_len, int64_t num_heads,
                                int64_t num_kv_heads, double scale, double min_confidence) {
  TORCH_CHECK(k >= 1 && h.dim() == 2 && h.size(0) == 1, "eagle3_draft_rows: k >= 1 drafts from h [1, H], got k = ",
              k, " and h ", h.sizes());
  TORCH_CHECK(min_confidence >= 0 && min_confidence < 1, "eagle3_draft_rows: min_confidence in [0, 1), got ",
              min_confidence);
  TORCH_CHECK(embed.dim() == 2 && embed.scalar_type() == torch::kFloat && embed.is_contiguous() &&
              embed.size(1) == h.size(1), "eagle3_draft_rows: a contiguous float32 embedding [V, ", h.size(1),
              "], got ", embed.scalar_type(), " ", embed.sizes());
  TORCH_CHECK(d2t.scalar_type() == torch::kLong && d2t.dim() == 1 && d2t.size(0) == lm_head.size(0),
              "eagle3_draft_rows: d2t [", lm_head.size(0), "] int64, got ", d2t.scalar_type(), " ", d2t.sizes());
  TORCH_CHECK(cos.size(0) >= k - 1 && sin.size(0) >= k - 1 && cache_positions.numel() >= k - 1,
              "eagle3_draft_rows: angles and cache positions for the ", k - 1, " positions after the first draft");
  auto drafts = torch::empty({k}, torch::kLong);
  int64_t* out = drafts.data_ptr<int64_t>();
  const int64_t* offsets = d2t.data_ptr<int64_t>();
  // With min_confidence, drafting stops before the first draft at which the product of
  // the drafts' top probabilities falls below it: the chance, as the head sees it, that
  // every draft so far is accepted.
  double confidence = 1.0;
  int64_t n = 0;  // drafts kept
  while (n < k) {
    const auto logits = few_row_linear(rms_norm_rows(h, norm_f, eps_f), lm_head);
    const int64_t id = at::argmax(logits, 1).item<int64_t>();
    if (min_confidence > 0) {
      const float* l = logits.data_ptr<float>();
      confidence *= top_probability(l, logits.size(1), l[id]);
      if (confidence < min_confidence) break;
    }
    const int64_t token = out[n++] = id + offsets[id];
    if (n == k) break;
    TORCH_CHECK(token >= 0 && token < embed.size(0), "eagle3_draft_rows: d2t maps draft id ", id, " to ", token,
                ", outside the embedding's ", embed.size(0), " rows");
    const int64_t j = n - 1;  // the position after the draft just made
    h = eagle3_layer_rows(embed.narrow(0, token, 1), norm_e, eps_e, h, norm_h, eps_h, norm_before_residual, w_qkv,
                          w_o, norm2, eps2, w_gate_up, w_down, cos.narrow(0, j, 1), sin.narrow(0, j, 1), k_cache,
                          v_cache, slot, cache_positions.narrow(0, j, 1), kv_len, num_heads, num_kv_heads, scale);
  }
  return drafts.narrow(0, 0, n);
}

// Attention of T <= 8 tokens of one sequence (cache row ``slot``) over their cache:
// q [T, num_heads * d] (roped; the tokens' keys and values already written at their
// cache positions), causal by cache position up to kv_len. cache_attention_rows, the
// decoder layer's own attention, for layers that keep their modules (an EAGLE head's).
torch::Tensor cache_attention(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                              int64_t slot, const torch::Tensor& cache_positions, int64_t kv_len, int64_t num_heads,
                              int64_t num_kv_heads, double scale) {
  const int64_t T = q.size(0);
  check_caches("cache_attention", k_cache, v_cache, slot, cache_positions, T, kv_len, num_heads, num_kv_heads);
  const int64_t d = k_cache.size(3), max_len = k_cache.size(1), kv_width = num_kv_heads * d;
  TORCH_CHECK(q.is_contiguous() && q.scalar_type() == torch::kFloat && q.dim() == 2 && q.size(1) == num_heads * d &&
              T <= 8, "cache_attention: contiguous float32 q [T <= 8, ", num_heads * d, "], got ", q.sizes());
  auto out = torch::empty({T, num_heads * d}, q.options());
  cache_attention_rows(q.data_ptr<float>(), num_heads * d, k_cache.data_ptr<float>() + slot * max_len * kv_width,
                       v_cache.data_ptr<float>() + slot * max_len * kv_width, kv_width,
                       cache_positions.data_ptr<int64_t>(), T, kv_len, num_heads, num_kv_heads, d,
                       static_cast<float>(scale), out.data_ptr<float>());
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("cache_attention", &cache_attention, "causal attention of a few float32 tokens over their cache row (CPU)");
  m.def("llama_layer_rows", &llama_layer_rows, "an exact Llama decoder layer for a few float32 tokens (CPU)");
  m.def("llama_stack_rows", &llama_stack_rows, "a model's exact Llama decoder layers for a few float32 tokens (CPU)");
  m.def("eagle3_layer_rows", &eagle3_layer_rows,
        "an EAGLE-3 head's first decoder layer for a few float32 tokens (CPU)");
  m.def("eagle3_catch_up_rows", &eagle3_catch_up_rows,
        "an EAGLE-3 head's catch-up over a few verified float32 tokens (CPU)");
  m.def("eagle3_draft_rows", &eagle3_draft_rows, "an EAGLE-3 head's greedy drafts for one float32 sequence (CPU)");
  m.def("few_row_linear", &few_row_linear, "y = x @ w^T for a few float32 rows (CPU)");
  m.def("few_row_linear_int8", &few_row_linear_int8, "few_row_linear from a weight's exact int8 blocks (CPU)");
  m.def("rms_norm_rows", &rms_norm_rows, "RMSNorm of a few float32 rows (CPU)");
  m.def("q4_blocks", &q4_blocks, "a float32 weight's exact 4-bit blocks, or an empty tensor (CPU)");
}
