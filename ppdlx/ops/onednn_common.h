// Helpers shared by ppdlx's oneDNN ops (onednn_kernels.cc, onednn_norm_pool.cc).
#pragma once

#include <dnnl.hpp>

#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "paddle/extension.h"

namespace ppdlx_onednn {

using dnnl::memory;
using tag = memory::format_tag;

inline dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

inline bool is_bf16(const paddle::Tensor& t) { return t.dtype() == paddle::DataType::BFLOAT16; }

inline memory::data_type dnnl_type(bool bf16) { return bf16 ? memory::data_type::bf16 : memory::data_type::f32; }

inline paddle::DataType paddle_type(bool bf16) { return bf16 ? paddle::DataType::BFLOAT16 : paddle::DataType::FLOAT32; }

// A oneDNN memory of the tensor's type (float32 or bfloat16) over its buffer (no copy).
inline memory plain(const memory::dims& dims, tag layout, const paddle::Tensor& t) {
  return memory({dims, dnnl_type(is_bf16(t)), layout}, cpu_engine(), const_cast<void*>(t.data()));
}

inline void check_activation(const paddle::Tensor& t, const char* op) {
  PD_CHECK(t.is_cpu() && t.is_contiguous() &&
               (t.dtype() == paddle::DataType::FLOAT32 || t.dtype() == paddle::DataType::BFLOAT16),
           "ppdlx onednn ", op, ": contiguous float32 or bfloat16 CPU input expected");
}

// oneDNN's logical {N, C, H, W} dims of a 4-D Paddle shape, and back.
inline memory::dims dnnl_dims(const std::vector<int64_t>& shape, bool channels_last) {
  PD_CHECK(shape.size() == 4, "ppdlx onednn ops: 4-D input expected");
  return channels_last ? memory::dims{shape[0], shape[3], shape[1], shape[2]}
                       : memory::dims{shape[0], shape[1], shape[2], shape[3]};
}

inline std::vector<int64_t> paddle_shape(const memory::dims& d, bool channels_last) {
  return channels_last ? std::vector<int64_t>{d[0], d[2], d[3], d[1]} : std::vector<int64_t>{d[0], d[1], d[2], d[3]};
}

// oneDNN's name for the instruction set it dispatches to here (ONEDNN_MAX_CPU_ISA lowers it).
inline const char* effective_isa_name() {
  using isa = dnnl::cpu_isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case isa::sse41: return "sse41";
    case isa::avx: return "avx";
    case isa::avx2: return "avx2";
    case isa::avx2_vnni: return "avx2_vnni";
    case isa::avx2_vnni_2: return "avx2_vnni_2";
    case isa::avx512_core: return "avx512_core";
    case isa::avx512_core_vnni: return "avx512_core_vnni";
    case isa::avx512_core_bf16: return "avx512_core_bf16";
    case isa::avx512_core_fp16: return "avx512_core_fp16";
    case isa::avx512_core_amx: return "avx512_core_amx";
    case isa::avx512_core_amx_fp16: return "avx512_core_amx_fp16";
    default: return "an unnamed instruction set";
  }
}

// Runs an op's body and turns oneDNN's exceptions into Paddle errors, which reach Python as one
// exception: a dnnl::error leaving a custom op's backward through Paddle's autograd node ends in
// std::terminate, which kills the process (a missing bf16 primitive on an AVX2-only CPU did).
template <typename Body>
std::vector<paddle::Tensor> guarded(const char* op, bool bf16, Body&& body) {
  try {
    return body();
  } catch (const dnnl::error& e) {
    PD_THROW("ppdlx onednn ", op, ": oneDNN cannot run it in ", bf16 ? "bfloat16" : "float32",
             " on this CPU (its instruction set here: ", effective_isa_name(),
             bf16 ? "; bfloat16 needs avx512_core or newer" : "", "): ", e.what());
  }
}

// The forward and backward primitives of a training op, with their descriptors.
template <typename Forward, typename Backward>
struct TrainingPrimitives {
  typename Forward::primitive_desc forward;
  typename Backward::primitive_desc backward;
  Forward forward_prim;
  Backward backward_prim;
};

// The primitives of one op shape, built on first use (Paddle runs dygraph ops on one thread).
template <typename Primitives, typename Make>
inline const Primitives& cached(const std::string& key, Make make) {
  static std::map<std::string, std::unique_ptr<Primitives>> cache;
  auto& slot = cache[key];
  if (!slot) slot.reset(new Primitives(make()));
  return *slot;
}

}  // namespace ppdlx_onednn
