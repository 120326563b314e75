// Paged attention (decode rows and prefill chunks) for XLA:CPU, called through the XLA FFI (jaxpaged/attention/cpu_attention.py).
//
// Why C++: on CPU the XLA paths gather every sequence's K/V blocks into a contiguous copy before
// the score and value matmuls, and XLA:CPU's gather moves a few GB/s: on a 64-sequence decode step
// the gather is most of the attention time. This kernel reads each block in place through the
// block table, once for all the query heads that share its KV head, with an online softmax, as
// vLLM's CPU and GPU paged-attention kernels do.
//
// Semantics are those of pallas_kernels/reference.py: the `query_lens[s]` query rows of sequence s
// from row `query_start[s]` sit at positions `context_lens[s] - query_lens[s]` .. `context_lens[s] - 1`,
// and the query at position pos attends to keys max(0, pos - window + 1) .. pos; scores are scaled
// by `sm_scale`, soft-capped when `soft_cap` > 0, and rows of padding sequences
// (`query_lens[s] == 0`) are zero. Work items are (sequence, KV head) pairs for a decode row and
// (sequence, KV head, tile of 16 query positions) for a prefill chunk, spread over XLA's intra-op
// thread pool.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

float Bf16ToFloat(uint16_t bits) {
  uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
}

uint16_t FloatToBf16(float value) {  // round to nearest even, as XLA's convert does
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

float Fp8E4M3FnToFloat(uint8_t bits) {  // 1 sign, 4 exponent (bias 7), 3 mantissa; no infinities
  const int sign = bits >> 7, exponent = (bits >> 3) & 0xF, mantissa = bits & 0x7;
  float magnitude;
  if (exponent == 0xF && mantissa == 0x7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: m/8 * 2^-6
  } else {
    magnitude = std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
  }
  return sign ? -magnitude : magnitude;
}

struct Fp8Table {
  float values[256];
  Fp8Table() {
    for (int i = 0; i < 256; ++i) values[i] = Fp8E4M3FnToFloat(static_cast<uint8_t>(i));
  }
};

const Fp8Table& Fp8Values() {
  static const Fp8Table table;
  return table;
}

// One layer's pool as this kernel reads it: `[num_kv_heads, num_blocks, block_size, head_dim]`.
struct Pool {
  const void* data;
  ffi::DataType dtype;
  const float* scale;  // [num_kv_heads] for fp8 pools, else nullptr
};

// The running maximum before any score: finite, so the kernel can be built with -ffast-math (whose
// finite-math assumption lets the compiler vectorise exp); every real score is far above it.
constexpr float kNoScore = -1e30f;

struct Shapes {
  int64_t num_seqs, num_q_heads, head_dim, num_kv_heads, num_blocks, block_size, blocks_per_seq;
};

struct Options {
  float sm_scale;
  int64_t sliding_window;  // 0: full attention
  float soft_cap;          // 0: none
};

struct Bf16 {
  uint16_t bits;
};

inline float ToFloat(float value) { return value; }
inline float ToFloat(Bf16 value) {
  uint32_t widened = static_cast<uint32_t>(value.bits) << 16;
  float result;
  std::memcpy(&result, &widened, sizeof(result));
  return result;
}

// One (sequence, KV head)'s online softmax over the query heads of its group (a prefill tile: over
// its positions x group heads, `group` rows): the scaled queries, the running maximum and
// denominator per row, and the unnormalised output rows.
struct GroupState {
  int64_t group, dim, block_size;
  std::vector<float> queries, acc, scores, running_max, denom;
  GroupState(int64_t group, int64_t dim, int64_t block_size)
      : group(group), dim(dim), block_size(block_size), queries(group * dim), acc(group * dim, 0.0f),
        scores(group * block_size), running_max(group, kNoScore), denom(group, 0.0f) {}
};

// Folds `n` consecutive keys and values (rows of `dim` elements) into `state`. `Dim` is the head
// dimension when it is known at compile time (the common 64, 128, 256: loops unroll and each head's
// accumulator stays in registers), else 0 and `state.dim` is used.
template <int Dim, typename E>
void AttendRows(const E* keys, const E* values, int64_t n, float soft_cap, GroupState& state) {
  const int64_t group = state.group, dim = Dim ? Dim : state.dim, stride = state.block_size;
  for (int64_t g = 0; g < group; ++g) {
    const float* qg = state.queries.data() + g * dim;
    float* sg = state.scores.data() + g * stride;
    float block_max = kNoScore;
    for (int64_t t = 0; t < n; ++t) {
      const E* kt = keys + t * dim;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < dim; ++d) dot += qg[d] * ToFloat(kt[d]);
      if (soft_cap > 0.0f) dot = soft_cap * std::tanh(dot / soft_cap);
      sg[t] = dot;
      block_max = std::max(block_max, dot);
    }
    const float new_max = std::max(state.running_max[g], block_max);
    const float rescale = std::exp(state.running_max[g] - new_max);  // 0 before the first block
    float block_sum = 0.0f;
#pragma omp simd reduction(+ : block_sum)
    for (int64_t t = 0; t < n; ++t) {
      sg[t] = std::exp(sg[t] - new_max);
      block_sum += sg[t];
    }
    state.denom[g] = state.denom[g] * rescale + block_sum;
    state.running_max[g] = new_max;
    float* ag = state.acc.data() + g * dim;
    float out[Dim ? Dim : 1];  // the head's running output, in registers when Dim is known
    float* row = Dim ? out : ag;
#pragma omp simd
    for (int64_t d = 0; d < dim; ++d) row[d] = ag[d] * rescale;
    for (int64_t t = 0; t < n; ++t) {
      const E* vt = values + t * dim;
      const float p = sg[t];
#pragma omp simd
      for (int64_t d = 0; d < dim; ++d) row[d] += p * ToFloat(vt[d]);
    }
    if (Dim) std::memcpy(ag, out, sizeof(float) * dim);
  }
}

// AttendRows for a head dimension known at compile time where it is a common one.
template <typename E>
void AttendRowsAnyDim(const E* keys, const E* values, int64_t n, float soft_cap, GroupState& state) {
  switch (state.dim) {
    case 64: return AttendRows<64>(keys, values, n, soft_cap, state);
    case 128: return AttendRows<128>(keys, values, n, soft_cap, state);
    case 256: return AttendRows<256>(keys, values, n, soft_cap, state);
    default: return AttendRows<0>(keys, values, n, soft_cap, state);
  }
}

// Dequantises `count` fp8 elements of `pool` from element `offset` into `out`.
void DequantiseFp8(const Pool& pool, int64_t offset, int64_t count, float scale, float* out) {
  const uint8_t* src = static_cast<const uint8_t*>(pool.data) + offset;
  const float* table = Fp8Values().values;
  for (int64_t i = 0; i < count; ++i) out[i] = table[src[i]] * scale;
}

// Attention of sequence `seq`'s decode row for the query heads of KV head `kv_head`.
void AttendOne(int64_t seq, int64_t kv_head, const Shapes& shape, const Options& opt, const void* q,
               ffi::DataType q_dtype, const Pool& k_pool, const Pool& v_pool, const int32_t* block_tables,
               const int32_t* context_lens, const int32_t* query_start, void* out) {
  const int64_t group = shape.num_q_heads / shape.num_kv_heads;
  const int64_t dim = shape.head_dim, bsz = shape.block_size;
  const int64_t first_q = query_start[seq] * shape.num_q_heads + kv_head * group;  // [row, first head]
  GroupState state(group, dim, bsz);
  for (int64_t i = 0; i < group * dim; ++i) {
    const int64_t at = first_q * dim + i;
    state.queries[i] = (q_dtype == ffi::DataType::F32 ? static_cast<const float*>(q)[at]
                                                      : Bf16ToFloat(static_cast<const uint16_t*>(q)[at])) *
                       opt.sm_scale;
  }
  const int64_t last = context_lens[seq] - 1;
  const int64_t first = opt.sliding_window > 0 ? std::max<int64_t>(0, last - opt.sliding_window + 1) : 0;
  std::vector<float> k_tile, v_tile;  // fp8 pools only: one block dequantised
  if (k_pool.dtype == ffi::DataType::F8E4M3FN) {
    k_tile.resize(bsz * dim);
    v_tile.resize(bsz * dim);
  }
  const int64_t element_bytes = k_pool.dtype == ffi::DataType::F32 ? 4 : k_pool.dtype == ffi::DataType::BF16 ? 2 : 1;
  const int32_t* table = block_tables + seq * shape.blocks_per_seq;
  for (int64_t logical = first / bsz; logical <= last / bsz; ++logical) {
    const int64_t block = table[logical];
    if (logical < last / bsz) {  // blocks sit at random in the pool: fetch the next one's K/V early
      const int64_t next = (kv_head * shape.num_blocks + table[logical + 1]) * bsz * dim * element_bytes;
      for (int64_t line = 0; line < bsz * dim * element_bytes; line += 64) {
        __builtin_prefetch(static_cast<const char*>(k_pool.data) + next + line);
        __builtin_prefetch(static_cast<const char*>(v_pool.data) + next + line);
      }
    }
    const int64_t lo = std::max(first - logical * bsz, int64_t{0});
    const int64_t n = std::min(last - logical * bsz + 1, bsz) - lo;
    const int64_t offset = ((kv_head * shape.num_blocks + block) * bsz + lo) * dim;
    switch (k_pool.dtype) {
      case ffi::DataType::F32:
        AttendRowsAnyDim(static_cast<const float*>(k_pool.data) + offset, static_cast<const float*>(v_pool.data) + offset,
                   n, opt.soft_cap, state);
        break;
      case ffi::DataType::BF16:
        AttendRowsAnyDim(static_cast<const Bf16*>(k_pool.data) + offset, static_cast<const Bf16*>(v_pool.data) + offset,
                   n, opt.soft_cap, state);
        break;
      default:
        DequantiseFp8(k_pool, offset, n * dim, k_pool.scale[kv_head], k_tile.data());
        DequantiseFp8(v_pool, offset, n * dim, v_pool.scale[kv_head], v_tile.data());
        AttendRowsAnyDim(k_tile.data(), v_tile.data(), n, opt.soft_cap, state);
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    const float inv = state.denom[g] > 0.0f ? 1.0f / state.denom[g] : 0.0f;
    for (int64_t d = 0; d < dim; ++d) {
      const int64_t at = (first_q + g) * dim + d;
      const float value = state.acc[g * dim + d] * inv;
      if (q_dtype == ffi::DataType::F32) {
        static_cast<float*>(out)[at] = value;
      } else {
        static_cast<uint16_t*>(out)[at] = FloatToBf16(value);
      }
    }
  }
}

// Query positions of one prefill work item: its rows (positions x group heads) share each K/V
// block's conversion and transposition.
constexpr int64_t kQueryTile = 16;
// Keys scored together: one AVX-512 register of float32 scores.
constexpr int64_t kKeyLanes = 16;

// One K/V block as float32, keys `begin .. end` of it: K transposed (`[dim][block_size]`, so a
// query row's scores for 16 keys are 16-wide multiply-adds) and V as rows (`[block_size][dim]`).
struct BlockTile {
  int64_t keys_stride;  // the block size rounded up to whole 16-key groups (the padding stays zero)
  std::vector<float> keys_t, values, key_row;  // key_row: one key as read, before it is transposed
  BlockTile(int64_t dim, int64_t block_size)
      : keys_stride((block_size + kKeyLanes - 1) / kKeyLanes * kKeyLanes),
        keys_t(dim * keys_stride, 0.0f), values(block_size * dim), key_row(dim) {}
};

// Converts keys `begin .. end` of the block at element `offset` of `pool` into `tile` (K transposed).
void LoadBlock(const Pool& k_pool, const Pool& v_pool, int64_t kv_head, int64_t offset, int64_t begin,
               int64_t end, int64_t dim, int64_t bsz, BlockTile& tile) {
  auto load = [&](const Pool& pool, int64_t t, float* row) {
    const int64_t at = offset + t * dim;
    switch (pool.dtype) {
      case ffi::DataType::F32:
        std::memcpy(row, static_cast<const float*>(pool.data) + at, sizeof(float) * dim);
        break;
      case ffi::DataType::BF16:
        for (int64_t d = 0; d < dim; ++d) row[d] = Bf16ToFloat(static_cast<const uint16_t*>(pool.data)[at + d]);
        break;
      default:
        DequantiseFp8(pool, at, dim, pool.scale[kv_head], row);
    }
  };
  float* key = tile.key_row.data();
  for (int64_t t = begin; t < end; ++t) {
    load(k_pool, t, key);
    for (int64_t d = 0; d < dim; ++d) tile.keys_t[d * tile.keys_stride + t] = key[d];
    load(v_pool, t, tile.values.data() + t * dim);
  }
}

// Rows scored together against each 16 keys: their 4 x 16 partial sums stay in vector registers
// while the keys' transposed column is loaded once for all of them.
constexpr int64_t kRowsPerPass = 4;

// Scores of query rows `r0 .. r0 + 4` (already scaled; the query buffer is padded to whole passes)
// against keys `begin .. end` of a transposed block, into `scores` (`[rows][keys_stride]`). Keys a
// row may not see are scored too and left out by FoldRow.
void ScoreRows(const float* queries, int64_t dim, int64_t keys_stride, int64_t r0, const BlockTile& tile,
               int64_t begin, int64_t end, float soft_cap, float* scores) {
  const float* q0 = queries + r0 * dim;
  const float* q1 = q0 + dim;
  const float* q2 = q1 + dim;
  const float* q3 = q2 + dim;
  for (int64_t t0 = begin - begin % kKeyLanes; t0 < end; t0 += kKeyLanes) {
    float l0[kKeyLanes] = {}, l1[kKeyLanes] = {}, l2[kKeyLanes] = {}, l3[kKeyLanes] = {};
    for (int64_t d = 0; d < dim; ++d) {
      const float* kd = tile.keys_t.data() + d * keys_stride + t0;
      const float a0 = q0[d], a1 = q1[d], a2 = q2[d], a3 = q3[d];
#pragma omp simd
      for (int64_t j = 0; j < kKeyLanes; ++j) {
        l0[j] += a0 * kd[j];
        l1[j] += a1 * kd[j];
        l2[j] += a2 * kd[j];
        l3[j] += a3 * kd[j];
      }
    }
    float* lanes[kRowsPerPass] = {l0, l1, l2, l3};
    for (int64_t r = 0; r < kRowsPerPass; ++r) {
      float* row = scores + (r0 + r) * keys_stride + t0;
#pragma omp simd
      for (int64_t j = 0; j < kKeyLanes; ++j) {
        row[j] = soft_cap > 0.0f ? soft_cap * std::tanh(lanes[r][j] / soft_cap) : lanes[r][j];
      }
    }
  }
}

// Folds keys `begin .. end` of `tile` into row `r`'s online softmax (`dim` known at compile time
// when `Dim` is nonzero, as in AttendRows); `scores` is the row's, overwritten by its weights.
template <int Dim>
void FoldRow(float* scores, const BlockTile& tile, int64_t begin, int64_t end, int64_t r, int64_t dim_arg,
             GroupState& state) {
  const int64_t dim = Dim ? Dim : dim_arg;
  float block_max = kNoScore;
  for (int64_t t = begin; t < end; ++t) block_max = std::max(block_max, scores[t]);
  const float new_max = std::max(state.running_max[r], block_max);
  const float rescale = std::exp(state.running_max[r] - new_max);
  float block_sum = 0.0f;
#pragma omp simd reduction(+ : block_sum)
  for (int64_t t = begin; t < end; ++t) {
    scores[t] = std::exp(scores[t] - new_max);
    block_sum += scores[t];
  }
  float* acc = state.acc.data() + r * dim;
  float out[Dim ? Dim : 1];
  float* row = Dim ? out : acc;
#pragma omp simd
  for (int64_t d = 0; d < dim; ++d) row[d] = acc[d] * rescale;
  for (int64_t t = begin; t < end; ++t) {
    const float p = scores[t];
    const float* vt = tile.values.data() + t * dim;
#pragma omp simd
    for (int64_t d = 0; d < dim; ++d) row[d] += p * vt[d];
  }
  if (Dim) std::memcpy(acc, out, sizeof(float) * dim);
  state.denom[r] = state.denom[r] * rescale + block_sum;
  state.running_max[r] = new_max;
}

void FoldRowAnyDim(float* scores, const BlockTile& tile, int64_t begin, int64_t end, int64_t r,
                   GroupState& state) {
  switch (state.dim) {
    case 64: return FoldRow<64>(scores, tile, begin, end, r, 64, state);
    case 128: return FoldRow<128>(scores, tile, begin, end, r, 128, state);
    case 256: return FoldRow<256>(scores, tile, begin, end, r, 256, state);
    default: return FoldRow<0>(scores, tile, begin, end, r, state.dim, state);
  }
}

// Attention of query positions `first .. first + count` of sequence `seq` (a prefill chunk's
// tile) for the query heads of KV head `kv_head`: each K/V block is converted once for the
// tile's rows, and a row visits only the keys its position and window allow.
void AttendTile(int64_t seq, int64_t kv_head, int64_t first, int64_t count, const Shapes& shape,
                const Options& opt, const void* q, ffi::DataType q_dtype, const Pool& k_pool, const Pool& v_pool,
                const int32_t* block_tables, const int32_t* context_lens, const int32_t* query_start,
                const int32_t* query_lens, void* out) {
  const int64_t group = shape.num_q_heads / shape.num_kv_heads;
  const int64_t dim = shape.head_dim, bsz = shape.block_size;
  const int64_t base_pos = context_lens[seq] - query_lens[seq];  // position of the chunk's first query
  const int64_t rows = count * group;
  const int64_t padded_rows = (rows + kRowsPerPass - 1) / kRowsPerPass * kRowsPerPass;
  BlockTile tile(dim, bsz);
  const int64_t stride = tile.keys_stride;
  // rows x stride scores (`state.scores`); the padding rows' queries stay zero
  GroupState state(padded_rows, dim, stride);
  auto q_at = [&](int64_t i, int64_t g) {  // element offset of query i's head g
    return ((query_start[seq] + first + i) * shape.num_q_heads + kv_head * group + g) * dim;
  };
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t at = q_at(i, g);
      float* row = state.queries.data() + (i * group + g) * dim;
      for (int64_t d = 0; d < dim; ++d) {
        row[d] = (q_dtype == ffi::DataType::F32 ? static_cast<const float*>(q)[at + d]
                                                : Bf16ToFloat(static_cast<const uint16_t*>(q)[at + d])) *
                 opt.sm_scale;
      }
    }
  }
  auto lowest_key = [&](int64_t pos) {
    return opt.sliding_window > 0 ? std::max<int64_t>(0, pos - opt.sliding_window + 1) : int64_t{0};
  };
  const int64_t first_pos = base_pos + first, last_pos = first_pos + count - 1;
  const int64_t lo_key = lowest_key(first_pos);
  const int32_t* table = block_tables + seq * shape.blocks_per_seq;
  for (int64_t logical = lo_key / bsz; logical <= last_pos / bsz; ++logical) {
    const int64_t block_start = logical * bsz;
    const int64_t begin = std::max(lo_key - block_start, int64_t{0});
    const int64_t end = std::min(last_pos - block_start + 1, bsz);
    const int64_t offset = (kv_head * shape.num_blocks + table[logical]) * bsz * dim;
    LoadBlock(k_pool, v_pool, kv_head, offset, begin, end, dim, bsz, tile);
    // rows whose position is before this block see none of it: queries from `live` on do
    const int64_t live = std::max<int64_t>(0, block_start - first_pos) * group;
    for (int64_t r0 = live - live % kRowsPerPass; r0 < rows; r0 += kRowsPerPass) {
      ScoreRows(state.queries.data(), dim, stride, r0, tile, begin, end, opt.soft_cap, state.scores.data());
    }
    for (int64_t r = live; r < rows; ++r) {
      const int64_t pos = first_pos + r / group;
      const int64_t row_begin = std::max(lowest_key(pos) - block_start, begin);
      const int64_t row_end = std::min(pos - block_start + 1, end);
      if (row_begin < row_end) FoldRowAnyDim(state.scores.data() + r * stride, tile, row_begin, row_end, r, state);
    }
  }
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t r = i * group + g, at = q_at(i, g);
      const float inv = state.denom[r] > 0.0f ? 1.0f / state.denom[r] : 0.0f;
      for (int64_t d = 0; d < dim; ++d) {
        const float value = state.acc[r * dim + d] * inv;
        if (q_dtype == ffi::DataType::F32) {
          static_cast<float*>(out)[at + d] = value;
        } else {
          static_cast<uint16_t*>(out)[at + d] = FloatToBf16(value);
        }
      }
    }
  }
}

// Items claimed from a shared counter by the calling thread and by pool workers; the caller
// returns once every item is done (workers that start late find none left and only touch this).
struct WorkQueue {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mutex;
  std::condition_variable all_done;
};

template <typename Work>
void RunItems(const std::shared_ptr<WorkQueue>& queue, int64_t total, const Work& work) {
  int64_t finished = 0;
  for (int64_t item; (item = queue->next.fetch_add(1)) < total;) {
    work(item);
    ++finished;
  }
  if (finished && queue->done.fetch_add(finished) + finished == total) {
    std::lock_guard<std::mutex> lock(queue->mutex);
    queue->all_done.notify_all();
  }
}

ffi::Error PagedAttentionImpl(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k_pages,
                           ffi::AnyBuffer v_pages, ffi::Buffer<ffi::F32> k_scale,
                           ffi::Buffer<ffi::F32> v_scale, ffi::Buffer<ffi::S32> block_tables,
                           ffi::Buffer<ffi::S32> context_lens, ffi::Buffer<ffi::S32> query_start,
                           ffi::Buffer<ffi::S32> query_lens, float sm_scale, int64_t sliding_window,
                           float soft_cap, ffi::Result<ffi::AnyBuffer> out) {
  const auto q_dims = q.dimensions();
  const auto pool_dims = k_pages.dimensions();
  const auto table_dims = block_tables.dimensions();
  if (q_dims.size() != 3 || pool_dims.size() != 4 || table_dims.size() != 2) {
    return ffi::Error::InvalidArgument("paged attention: q must be 3-D, pages 4-D, block_tables 2-D");
  }
  const ffi::DataType q_dtype = q.element_type();
  if (q_dtype != ffi::DataType::F32 && q_dtype != ffi::DataType::BF16) {
    return ffi::Error::InvalidArgument("paged attention: q must be float32 or bfloat16");
  }
  const ffi::DataType kv_dtype = k_pages.element_type();
  if (kv_dtype != ffi::DataType::F32 && kv_dtype != ffi::DataType::BF16 && kv_dtype != ffi::DataType::F8E4M3FN) {
    return ffi::Error::InvalidArgument("paged attention: pages must be float32, bfloat16 or float8_e4m3fn");
  }
  const Shapes shape{table_dims[0], q_dims[1],     q_dims[2], pool_dims[0],
                     pool_dims[1],  pool_dims[2], table_dims[1]};
  if (shape.num_q_heads % shape.num_kv_heads != 0 || pool_dims[3] != shape.head_dim) {
    return ffi::Error::InvalidArgument("paged attention: head counts or head_dim do not match the pool");
  }
  const bool fp8 = kv_dtype == ffi::DataType::F8E4M3FN;
  const Pool k_pool{k_pages.untyped_data(), kv_dtype, fp8 ? k_scale.typed_data() : nullptr};
  const Pool v_pool{v_pages.untyped_data(), kv_dtype, fp8 ? v_scale.typed_data() : nullptr};
  const Options options{sm_scale, sliding_window, soft_cap};
  const int32_t* tables = block_tables.typed_data();
  const int32_t* contexts = context_lens.typed_data();
  const int32_t* starts = query_start.typed_data();
  const int32_t* lens = query_lens.typed_data();
  const void* q_data = q.untyped_data();
  void* out_data = out->untyped_data();
  std::memset(out_data, 0, out->size_bytes());

  struct Tile {
    int64_t seq, first, count;  // query positions first .. first + count of the sequence's chunk
  };
  std::vector<Tile> tiles;  // a decode row is a tile of one query
  for (int64_t s = 0; s < shape.num_seqs; ++s) {
    if (contexts[s] <= 0) continue;
    for (int64_t first = 0; first < lens[s]; first += kQueryTile) {
      tiles.push_back({s, first, std::min<int64_t>(kQueryTile, lens[s] - first)});
    }
  }
  const int64_t total = static_cast<int64_t>(tiles.size()) * shape.num_kv_heads;
  auto work = [&, tiles_data = tiles.data()](int64_t item) {
    const Tile& tile = tiles_data[item / shape.num_kv_heads];
    const int64_t kv_head = item % shape.num_kv_heads;
    if (lens[tile.seq] == 1) {
      AttendOne(tile.seq, kv_head, shape, options, q_data, q_dtype, k_pool, v_pool, tables, contexts, starts,
                out_data);
    } else {
      AttendTile(tile.seq, kv_head, tile.first, tile.count, shape, options, q_data, q_dtype, k_pool, v_pool,
                 tables, contexts, starts, lens, out_data);
    }
  };
  auto queue = std::make_shared<WorkQueue>();
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), total) - 1;
  for (int64_t i = 0; i < helpers; ++i) {
    // `work` captures this frame by reference: a helper only runs it while items remain, and
    // this frame outlives every item (the wait below), so the references stay valid when used.
    pool.Schedule([queue, total, &work] { RunItems(queue, total, work); });
  }
  RunItems(queue, total, work);
  std::unique_lock<std::mutex> lock(queue->mutex);
  queue->all_done.wait(lock, [&] { return queue->done.load() == total; });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpagedPagedAttention, PagedAttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()        // q [T, Hq, D]
                                  .Arg<ffi::AnyBuffer>()        // k_pages [Hkv, N, B, D]
                                  .Arg<ffi::AnyBuffer>()        // v_pages
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k_scale [Hkv]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v_scale [Hkv]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // block_tables [S, M]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // context_lens [S]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // query_start [S]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // query_lens [S]
                                  .Attr<float>("sm_scale")
                                  .Attr<int64_t>("sliding_window")
                                  .Attr<float>("soft_cap")
                                  .Ret<ffi::AnyBuffer>());      // out [T, Hq, D]
