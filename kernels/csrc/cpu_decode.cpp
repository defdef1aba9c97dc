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

#include <cmath>

namespace {

// Dot product of a and b over K: four 8-wide fp32 accumulators over blocks of 32, one
// over the remaining blocks of 8, then a fixed-order horizontal sum and the scalar tail.
inline float dot(const float* a, const float* b, int64_t K) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 16), _mm256_loadu_ps(b + k + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 24), _mm256_loadu_ps(b + k + 24), s3);
  }
  for (; k + 8 <= K; k += 8) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), s0);
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  float total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; k < K; ++k) total += a[k] * b[k];
  return total;
}

}  // namespace

torch::Tensor few_row_linear(const torch::Tensor& x, const torch::Tensor& w) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "few_row_linear: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == torch::kFloat && w.scalar_type() == torch::kFloat,
              "few_row_linear: float32 only, got ", x.scalar_type(), " and ", w.scalar_type());
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1),
              "few_row_linear: x [M, K] and w [N, K], got ", x.sizes(), " and ", w.sizes());
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), "few_row_linear: contiguous x and w");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(M <= 8, "few_row_linear: at most 8 rows, got ", M);
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // Outputs split over torch's threads; 64 outputs at least per chunk (the layers are
  // 192 to 49,152 wide), each weight row read once for the M dot products.
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float* row = wp + n * K;
      for (int64_t m = 0; m < M; ++m) yp[m * N + n] = dot(xp + m * K, row, K);
    }
  });
  return y;
}

// RMSNorm of each row: y = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps), the order of
// operations of kernels/norm.py's reference (not its bits: another summation order).
// torch's F.rms_norm takes ~40 us a call here inside a decode step (several internal ops);
// this takes a few. One thread: a row is a few hundred to a few thousand floats.
torch::Tensor rms_norm_rows(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "rms_norm_rows: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == torch::kFloat && w.scalar_type() == torch::kFloat,
              "rms_norm_rows: float32 only, got ", x.scalar_type(), " and ", w.scalar_type());
  TORCH_CHECK(x.dim() == 2 && w.dim() == 1 && x.size(1) == w.size(0),
              "rms_norm_rows: x [M, N] and w [N], got ", x.sizes(), " and ", w.sizes());
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), "rms_norm_rows: contiguous x and w");
  const int64_t M = x.size(0), N = x.size(1);
  TORCH_CHECK(M <= 8, "rms_norm_rows: at most 8 rows, got ", M);
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("few_row_linear", &few_row_linear, "y = x @ w^T for a few float32 rows (CPU)");
  m.def("rms_norm_rows", &rms_norm_rows, "RMSNorm of a few float32 rows (CPU)");
}
