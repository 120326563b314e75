// float32 weight GEMMs for XLA:CPU through MKL's cblas_sgemm, called through the XLA FFI
// (jaxpaged/model/cpu_gemm.py, the "mkl" library).
//
// Why: at SmolLM2's float32 shapes MKL's sgemm (what torch, and so vLLM's CPU build, runs) is faster
// than XLA:CPU's dot, and oneDNN's float32 matmul was not (docs/benchmarks/cpu-performance.md).
//
// y[M, N] = x[M, K] @ w, where w is [K, N] (nnx.Linear's kernel) or, with `transpose_w`, [N, K]
// (a tied embedding used as the LM head), all float32, row-major. MKL is reached through its single
// dynamic library (libmkl_rt), which picks the threading layer and the CPU's kernels at run time;
// the Python side chooses the layer before the first call.

#include <cstdint>

#include "cpu_gemm_shape.h"
#include "mkl_cblas.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

void Sgemm(const float* x, const float* w, float* y, int64_t m, int64_t k, int64_t n, bool transpose_w) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, transpose_w ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, x, k, w,
              transpose_w ? k : n, 0.0f, y, n);
}

ffi::Error SgemmImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w, bool transpose_w,
                     ffi::ResultBuffer<ffi::F32> y) {
  GemmShape shape;
  if (ffi::Error error = ReadGemmShape(x.dimensions(), w.dimensions(), transpose_w, shape); error.failure()) {
    return error;
  }
  if (shape.m == 0 || shape.n == 0) {
    return ffi::Error::Success();
  }
  Sgemm(x.typed_data(), w.typed_data(), y->typed_data(), shape.m, shape.k, shape.n, transpose_w);
  return ffi::Error::Success();
}

}  // namespace

// 1 when MKL computes a small float32 product right here (its libraries load and run), 0 when not; 0 for
// bfloat16 (`bfloat16` 1), which this kernel does not take.
extern "C" int JaxpagedMklProbe(int bfloat16) {
  if (bfloat16) {
    return 0;
  }
  const float x[2] = {1.0f, 2.0f}, w[6] = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  float y[3] = {0.0f, 0.0f, 0.0f};
  Sgemm(x, w, y, 1, 2, 3, false);
  return y[0] == 9.0f && y[1] == 12.0f && y[2] == 15.0f;
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpagedMklSgemm, SgemmImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [M, K]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w [K, N], or [N, K] with transpose_w
                                  .Attr<bool>("transpose_w")
                                  .Ret<ffi::Buffer<ffi::F32>>());  // y [M, N]
