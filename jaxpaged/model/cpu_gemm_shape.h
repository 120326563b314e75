// A weight GEMM's sizes, read and checked from its FFI operands (cpu_gemm.cc for oneDNN, mkl_gemm.cc for MKL).
//
// y[M, N] = x[M, K] @ w, where w is [K, N] or, with `transpose_w`, [N, K].

#pragma once

#include <cstdint>

#include "xla/ffi/api/ffi.h"

struct GemmShape {
  int64_t m, k, n;
};

// Fills `shape` from x's and w's dimensions; an InvalidArgument error when they do not make a GEMM.
template <typename Dims>
xla::ffi::Error ReadGemmShape(Dims x_dims, Dims w_dims, bool transpose_w, GemmShape& shape) {
  if (x_dims.size() != 2 || w_dims.size() != 2) {
    return xla::ffi::Error::InvalidArgument("x and w must be 2-D");
  }
  shape = {x_dims[0], x_dims[1], transpose_w ? w_dims[0] : w_dims[1]};
  if ((transpose_w ? w_dims[1] : w_dims[0]) != shape.k) {
    return xla::ffi::Error::InvalidArgument("x's columns and w's contracted dimension differ");
  }
  return xla::ffi::Error::Success();
}
