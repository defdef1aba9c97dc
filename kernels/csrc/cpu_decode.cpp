// The float32 CPU kernels of decode steps (a few rows): few_row_linear, y[M, N] =
// x[M, K] @ w[N, K]^T, and rms_norm_rows, for M <= 8.
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
#include <cmath>
#include <cstring>
#include <vector>

namespace {

// Dot products of R rows a[r] with the same b over K: per row four 8-wide fp32
// accumulators over blocks of 32, one over the remaining blocks of 8, then a fixed-order
// horizontal sum and the scalar tail. b's vectors are loaded once for the R rows
// (verification steps are bound by these loads, not by memory), and every row runs the
// same arithmetic whatever R is, so a row's bits do not depend on its neighbours. R <= 3:
// 4R accumulators and four b vectors fit AVX2's sixteen registers.
template <int R>
inline void dot_rows(const float* const* a, const float* b, int64_t K, float* const* out) {
  __m256 s[R][4];
  for (int r = 0; r < R; ++r) s[r][0] = s[r][1] = s[r][2] = s[r][3] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m256 b0 = _mm256_loadu_ps(b + k), b1 = _mm256_loadu_ps(b + k + 8);
    const __m256 b2 = _mm256_loadu_ps(b + k + 16), b3 = _mm256_loadu_ps(b + k + 24);
    for (int r = 0; r < R; ++r) {
      s[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + k), b0, s[r][0]);
      s[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + k + 8), b1, s[r][1]);
      s[r][2] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + k + 16), b2, s[r][2]);
      s[r][3] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + k + 24), b3, s[r][3]);
    }
  }
  for (; k + 8 <= K; k += 8) {
    const __m256 b0 = _mm256_loadu_ps(b + k);
    for (int r = 0; r < R; ++r) s[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + k), b0, s[r][0]);
  }
  const int64_t tail = k;
  for (int r = 0; r < R; ++r) {
    alignas(32) float l[8];
    _mm256_store_ps(l, _mm256_add_ps(_mm256_add_ps(s[r][0], s[r][1]), _mm256_add_ps(s[r][2], s[r][3])));
    float total = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    for (k = tail; k < K; ++k) total += a[r][k] * b[k];
    *out[r] = total;
  }
}

inline float dot(const float* a, const float* b, int64_t K) {
  float total;
  float* out = &total;
  dot_rows<1>(&a, b, K, &out);
  return total;
}

// The checks both entry points make: float32 CPU tensors, contiguous, at most 8 rows of
// x [M, K] and a weight whose last dimension is K.
void check_rows(const char* fn, const torch::Tensor& x, const torch::Tensor& w, int64_t w_dim) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), fn, ": CPU tensors only");
  TORCH_CHECK(x.scalar_type() == torch::kFloat && w.scalar_type() == torch::kFloat, fn, ": float32 only, got ",
              x.scalar_type(), " and ", w.scalar_type());
  TORCH_CHECK(x.dim() == 2 && w.dim() == w_dim && x.size(1) == w.size(w_dim - 1), fn, ": x [M, K] and w [",
              w_dim == 2 ? "N, K" : "K", "], got ", x.sizes(), " and ", w.sizes());
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), fn, ": contiguous x and w");
  TORCH_CHECK(x.size(0) <= 8, fn, ": at most 8 rows, got ", x.size(0));
}

}  // namespace

torch::Tensor few_row_linear(const torch::Tensor& x, const torch::Tensor& w) {
  check_rows("few_row_linear", x, w, 2);
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // Outputs split over torch's threads; 64 outputs at least per chunk (the layers are
  // 192 to 49,152 wide), each weight row read once for the M dot products.
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float* row = wp + n * K;
      int64_t m = 0;
      for (; m + 3 <= M; m += 3) {
        const float* a[3] = {xp + m * K, xp + (m + 1) * K, xp + (m + 2) * K};
        float* y[3] = {yp + m * N + n, yp + (m + 1) * N + n, yp + (m + 2) * N + n};
        dot_rows<3>(a, row, K, y);
      }
      if (m + 2 <= M) {
        const float* a[2] = {xp + m * K, xp + (m + 1) * K};
        float* y[2] = {yp + m * N + n, yp + (m + 1) * N + n};
        dot_rows<2>(a, row, K, y);
        m += 2;
      }
      if (m < M) yp[m * N + n] = dot(xp + m * K, row, K);
    }
  });
  return y;
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

// One exact Llama decoder layer for T <= 8 tokens of one sequence (plain decoding and
// chain verification), float32: rmsnorm -> qkv -> neox rope of q and k -> KV-cache write
// -> causal attention over the cache row -> o_proj + residual -> rmsnorm -> gate_up ->
// silu(gate) * up -> down_proj + residual. Why one call: the module path runs ~13 torch
// ops and their Python a layer, ~12 ms a SmolLM2 step on the development CPU against
// ~17 ms of matmuls (BENCHMARKS.md, CPU). Every token row goes through the same code
// whatever T is, so verification gives plain decoding's bits.
torch::Tensor llama_layer_rows(const torch::Tensor& h, const torch::Tensor& norm1, double eps1,
                               const torch::Tensor& w_qkv, const torch::Tensor& w_o, const torch::Tensor& norm2,
                               double eps2, const torch::Tensor& w_gate_up, const torch::Tensor& w_down,
                               const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor k_cache,
                               torch::Tensor v_cache, int64_t slot, const torch::Tensor& cache_positions,
                               int64_t kv_len, int64_t num_heads, int64_t num_kv_heads, double scale) {
  const int64_t T = h.size(0);
  const int64_t d = k_cache.size(3);
  const int64_t half = d / 2, group = num_heads / num_kv_heads;
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.scalar_type() == torch::kFloat &&
              v_cache.scalar_type() == torch::kFloat && v_cache.size(3) == d && k_cache.size(2) == num_kv_heads,
              "llama_layer_rows: contiguous float32 caches [slots, len, kv_heads, d]");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == T * half && sin.numel() == T * half,
              "llama_layer_rows: cos / sin [T, d/2]");
  TORCH_CHECK(cache_positions.scalar_type() == torch::kLong && cache_positions.numel() == T,
              "llama_layer_rows: cache_positions [T] int64");
  const int64_t max_len = k_cache.size(1);
  const int64_t q_width = num_heads * d, kv_width = num_kv_heads * d;
  TORCH_CHECK(slot >= 0 && slot < k_cache.size(0), "llama_layer_rows: slot ", slot, " outside the caches' ",
              k_cache.size(0), " rows");
  TORCH_CHECK(w_qkv.size(0) == q_width + 2 * kv_width && w_o.size(1) == q_width && num_heads % num_kv_heads == 0,
              "llama_layer_rows: w_qkv [", q_width + 2 * kv_width, ", H] and w_o [H, ", q_width, "] for ", num_heads,
              " heads, ", num_kv_heads, " kv heads of ", d, ", got ", w_qkv.sizes(), " and ", w_o.sizes());

  torch::Tensor qkv = few_row_linear(rms_norm_rows(h, norm1, eps1), w_qkv);  // [T, q + k + v]
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
    TORCH_CHECK(pos[t] >= 0 && pos[t] < max_len, "llama_layer_rows: cache position ", pos[t], " outside [0, ",
                max_len, ")");
    const int64_t at = (slot * max_len + pos[t]) * kv_width;
    std::memcpy(kc + at, tok + q_width, kv_width * sizeof(float));
    std::memcpy(vc + at, tok + q_width + kv_width, kv_width * sizeof(float));
  }
  // Causal attention of each (token, head) over keys [0, min(pos + 1, kv_len)). A kv head's
  // keys and values are read once for every query that uses them (its group of query heads,
  // of every token): at long contexts the reads, not the arithmetic, set the pace, and a
  // query per read made a verification of T tokens read the cache T * group times. Each
  // query still does the same arithmetic in the same order (its scores in key order, their
  // max, exp and sum, then the values weighted in key order), so a row's bits do not
  // depend on T or on the other rows.
  auto attn = torch::empty({T, q_width}, h.options());
  float* ap = attn.data_ptr<float>();
  const int64_t nq = T * group;  // the queries of one kv head, token-major
  int64_t max_keys = 0;
  for (int64_t t = 0; t < T; ++t) max_keys = std::max(max_keys, std::min(pos[t] + 1, kv_len));
  const float fscale = static_cast<float>(scale);
  auto one_kv_head = [&](int64_t kvh) {
    std::vector<float> scores(static_cast<size_t>(std::max<int64_t>(nq * max_keys, 1)));
    std::vector<float> m(nq, -INFINITY), l(nq, 0.f);
    const float* k_head = kc + slot * max_len * kv_width + kvh * d;
    const float* v_head = vc + slot * max_len * kv_width + kvh * d;
    for (int64_t j = 0; j < max_keys; ++j) {
      const float* k = k_head + j * kv_width;
      for (int64_t t = 0; t < T; ++t) {
        if (j >= std::min(pos[t] + 1, kv_len)) continue;
        for (int64_t g = 0; g < group; ++g) {
          const int64_t qi = t * group + g;
          const float score = dot(qkvp + t * row + (kvh * group + g) * d, k, d) * fscale;
          scores[qi * max_keys + j] = score;
          m[qi] = std::max(m[qi], score);
        }
      }
    }
    for (int64_t qi = 0; qi < nq; ++qi) {
      const int64_t keys = std::min(pos[qi / group] + 1, kv_len);
      float* sc = scores.data() + qi * max_keys;
      for (int64_t j = 0; j < keys; ++j) {
        sc[j] = std::exp(sc[j] - m[qi]);
        l[qi] += sc[j];
      }
      float* out = ap + (qi / group) * q_width + (kvh * group + qi % group) * d;
      for (int64_t i = 0; i < d; ++i) out[i] = 0.f;
    }
    for (int64_t j = 0; j < max_keys; ++j) {
      const float* v = v_head + j * kv_width;
      for (int64_t t = 0; t < T; ++t) {
        if (j >= std::min(pos[t] + 1, kv_len)) continue;
        for (int64_t g = 0; g < group; ++g) {
          const int64_t qi = t * group + g;
          const float p = scores[qi * max_keys + j];
          float* out = ap + t * q_width + (kvh * group + g) * d;
          for (int64_t i = 0; i < d; ++i) out[i] += p * v[i];
        }
      }
    }
    for (int64_t qi = 0; qi < nq; ++qi) {
      const int64_t keys = std::min(pos[qi / group] + 1, kv_len);
      const float inv = keys > 0 ? 1.f / l[qi] : 0.f;
      float* out = ap + (qi / group) * q_width + (kvh * group + qi % group) * d;
      for (int64_t i = 0; i < d; ++i) out[i] *= inv;
    }
  };
  // kv heads over torch's threads once the work is worth a thread (a long context).
  at::parallel_for(0, num_kv_heads, max_keys * nq >= 4096 ? 1 : num_kv_heads, [&](int64_t begin, int64_t end) {
    for (int64_t kvh = begin; kvh < end; ++kvh) one_kv_head(kvh);
  });
  torch::Tensor h2 = h + few_row_linear(attn, w_o);
  torch::Tensor gu = few_row_linear(rms_norm_rows(h2, norm2, eps2), w_gate_up);  // [T, 2I]
  const int64_t inter = gu.size(1) / 2;
  auto act = torch::empty({T, inter}, h.options());
  const float* gp = gu.data_ptr<float>();
  float* mp = act.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < inter; ++i) {
      const float g = gp[t * 2 * inter + i];
      mp[t * inter + i] = (g / (1.f + std::exp(-g))) * gp[t * 2 * inter + inter + i];
    }
  }
  return h2 + few_row_linear(act, w_down);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("llama_layer_rows", &llama_layer_rows, "an exact Llama decoder layer for a few float32 tokens (CPU)");
  m.def("few_row_linear", &few_row_linear, "y = x @ w^T for a few float32 rows (CPU)");
  m.def("rms_norm_rows", &rms_norm_rows, "RMSNorm of a few float32 rows (CPU)");
}
