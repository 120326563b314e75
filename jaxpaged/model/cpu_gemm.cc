// Weight GEMMs for XLA:CPU through oneDNN, called through the XLA FFI (jaxpaged/model/cpu_gemm.py).
//
// Why: at a decode batch's row counts XLA:CPU's dots reach 0.57-0.73x of oneDNN's rate on the
// CPUs measured (docs/benchmarks/cpu-performance.md), and XLA's own oneDNN rewrite can neither be
// written to the persistent compile cache nor run every test. A custom call we register ourselves
// can be cached.
//
// y[M, N] = x[M, K] @ w, where w is [K, N] (nnx.Linear's kernel) or, with `transpose_w`, [N, K]
// (a tied embedding used as the LM head). float32 or bfloat16, the same for x, w and y; oneDNN
// accumulates in float32. The weights are read in their plain layout on every call: nothing is
// prepacked or keyed on a buffer's address, which XLA may reuse for other contents.
// One matmul primitive per (M, K, N, dtype, layout), created on first use and kept; primitives
// are safe to execute from several threads, each thread has its own stream.

#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>

#include "oneapi/dnnl/dnnl.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct ShapeKey {
  int64_t m, k, n;
  dnnl::memory::data_type dtype;
  bool transpose_w;
  bool operator==(const ShapeKey& other) const {
    return m == other.m && k == other.k && n == other.n && dtype == other.dtype &&
           transpose_w == other.transpose_w;
  }
};

struct ShapeKeyHash {
  size_t operator()(const ShapeKey& key) const {
    size_t h = std::hash<int64_t>()(key.m);
    for (int64_t part : {key.k, key.n, static_cast<int64_t>(key.dtype), static_cast<int64_t>(key.transpose_w)}) {
      h = h * 1000003u ^ std::hash<int64_t>()(part);
    }
    return h;
  }
};

dnnl::engine& CpuEngine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::memory::desc Plain(int64_t rows, int64_t cols, dnnl::memory::data_type dtype, bool transposed) {
  return dnnl::memory::desc({rows, cols}, dtype,
                            transposed ? dnnl::memory::format_tag::ba : dnnl::memory::format_tag::ab);
}

const dnnl::matmul& Primitive(const ShapeKey& key) {
  static std::mutex mutex;
  static std::unordered_map<ShapeKey, dnnl::matmul, ShapeKeyHash> primitives;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = primitives.find(key);
  if (found == primitives.end()) {
    dnnl::matmul::primitive_desc desc(CpuEngine(), Plain(key.m, key.k, key.dtype, false),
                                      Plain(key.k, key.n, key.dtype, key.transpose_w),
                                      Plain(key.m, key.n, key.dtype, false));
    found = primitives.emplace(key, dnnl::matmul(desc)).first;
  }
  return found->second;  // unordered_map never moves its elements
}

ffi::Error GemmImpl(ffi::AnyBuffer x, ffi::AnyBuffer w, bool transpose_w, ffi::Result<ffi::AnyBuffer> y) {
  const ffi::DataType type = x.element_type();
  if (type != w.element_type() || type != y->element_type()) {
    return ffi::Error::InvalidArgument("x, w and y must have one dtype");
  }
  dnnl::memory::data_type dtype;
  if (type == ffi::DataType::F32) {
    dtype = dnnl::memory::data_type::f32;
  } else if (type == ffi::DataType::BF16) {
    dtype = dnnl::memory::data_type::bf16;
  } else {
    return ffi::Error::InvalidArgument("the oneDNN GEMM takes float32 or bfloat16");
  }
  auto x_dims = x.dimensions(), w_dims = w.dimensions();
  if (x_dims.size() != 2 || w_dims.size() != 2) {
    return ffi::Error::InvalidArgument("x and w must be 2-D");
  }
  const int64_t m = x_dims[0], k = x_dims[1];
  const int64_t n = transpose_w ? w_dims[0] : w_dims[1];
  if ((transpose_w ? w_dims[1] : w_dims[0]) != k) {
    return ffi::Error::InvalidArgument("x's columns and w's contracted dimension differ");
  }
  if (m == 0 || n == 0) {
    return ffi::Error::Success();
  }
  try {
    const ShapeKey key{m, k, n, dtype, transpose_w};
    const dnnl::matmul& matmul = Primitive(key);
    thread_local dnnl::stream stream(CpuEngine());
    dnnl::memory src(Plain(m, k, dtype, false), CpuEngine(), x.untyped_data());
    dnnl::memory weights(Plain(k, n, dtype, transpose_w), CpuEngine(), w.untyped_data());
    dnnl::memory dst(Plain(m, n, dtype, false), CpuEngine(), y->untyped_data());
    matmul.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}});
    stream.wait();
  } catch (const dnnl::error& err) {
    return ffi::Error::Internal(err.what());
  }
  return ffi::Error::Success();
}

}  // namespace

// 1 when oneDNN can create its CPU engine here, 0 when not (e.g. its SYCL build finds no CPU device).
extern "C" int JaxpagedGemmProbe() {
  try {
    CpuEngine();
    return 1;
  } catch (const dnnl::error&) {
    return 0;
  }
}

// 1 when oneDNN has a matmul in bfloat16 (`bf16` != 0) or float32 on this CPU, 0 when not: the PyPI build has
// no bfloat16 matmul on an AVX2-only CPU ("could not create a primitive descriptor").
extern "C" int JaxpagedGemmSupports(int bf16) {
  try {
    const ShapeKey key{2, 16, 16, bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32, false};
    Primitive(key);
    return 1;
  } catch (const dnnl::error&) {
    return 0;
  }
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpagedGemm, GemmImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // x [M, K]
                                  .Arg<ffi::AnyBuffer>()  // w [K, N], or [N, K] with transpose_w
                                  .Attr<bool>("transpose_w")
                                  .Ret<ffi::AnyBuffer>());  // y [M, N]
