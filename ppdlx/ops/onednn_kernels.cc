// 2-D convolution (forward, input and filter gradients) on CPU through oneDNN, as a Paddle custom op.
//
// Why: Paddle 3.3.1's CPU conv2d kernels are im2col + one GEMM per sample, and its NHWC kernels
// transpose to NCHW inside; they are ~80 % of a ResNet50 training step. The oneDNN library that
// ships in Paddle's wheel (paddle/libs/libdnnl.so.3) has batched direct kernels for both layouts,
// but dygraph never dispatches to them. Tensors keep Paddle's plain layouts (NCHW or NHWC data,
// [O, I/groups, kh, kw] filters), so the op is a drop-in for paddle.nn.functional.conv2d.
// With `bf16` the convolution computes in bfloat16 (inputs, filters and incoming gradients rounded
// to bf16 inside the op; outputs and gradients float32, so float32 master weights and every other
// op are untouched): what PyTorch's CPU autocast does, for CPUs with bf16 hardware.
#include <dnnl.hpp>

#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "paddle/extension.h"

namespace {

using dnnl::memory;
using tag = memory::format_tag;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// A float32 oneDNN memory over a Paddle tensor's buffer (no copy).
memory plain(const memory::dims& dims, tag layout, const paddle::Tensor& t) {
  return memory({dims, memory::data_type::f32, layout}, cpu_engine(), const_cast<float*>(t.data<float>()));
}

// oneDNN's logical {N, C, H, W} dims of a 4-D Paddle shape, and back.
memory::dims dnnl_dims(const std::vector<int64_t>& shape, bool channels_last) {
  PD_CHECK(shape.size() == 4, "ppdlx onednn ops: 4-D input expected");
  return channels_last ? memory::dims{shape[0], shape[3], shape[1], shape[2]}
                       : memory::dims{shape[0], shape[1], shape[2], shape[3]};
}

std::vector<int64_t> paddle_shape(const memory::dims& d, bool channels_last) {
  return channels_last ? std::vector<int64_t>{d[0], d[2], d[3], d[1]} : std::vector<int64_t>{d[0], d[1], d[2], d[3]};
}

// The primitives of one op shape, built on first use (Paddle runs dygraph ops on one thread).
template <typename Primitives, typename Make>
const Primitives& cached(const std::string& key, Make make) {
  static std::map<std::string, std::unique_ptr<Primitives>> cache;
  auto& slot = cache[key];
  if (!slot) slot.reset(new Primitives(make()));
  return *slot;
}

struct ConvGeometry {
  memory::dims src, weights, dst, strides, dilations, pad_l, pad_r;
  tag data_tag, weights_tag;
  bool bf16 = false;
};

// Builds the geometry from Paddle shapes. paddings = {top, bottom, left, right}.
ConvGeometry geometry(const std::vector<int64_t>& x_shape, const std::vector<int64_t>& w_shape,
                      const std::vector<int>& strides, const std::vector<int>& paddings,
                      const std::vector<int>& dilations, int groups, bool channels_last, bool bf16 = false) {
  PD_CHECK(x_shape.size() == 4 && w_shape.size() == 4, "ppdlx onednn conv2d: 4-D input and filter expected");
  PD_CHECK(strides.size() == 2 && paddings.size() == 4 && dilations.size() == 2,
           "ppdlx onednn conv2d: strides/dilations need 2 values and paddings 4");
  const int64_t n = x_shape[0];
  const int64_t c = channels_last ? x_shape[3] : x_shape[1];
  const int64_t h = channels_last ? x_shape[1] : x_shape[2];
  const int64_t w = channels_last ? x_shape[2] : x_shape[3];
  const int64_t oc = w_shape[0], kh = w_shape[2], kw = w_shape[3];
  PD_CHECK(c == w_shape[1] * groups, "ppdlx onednn conv2d: input channels ", c, " != filter channels ",
           w_shape[1], " x groups ", groups);
  const int64_t oh = (h + paddings[0] + paddings[1] - (dilations[0] * (kh - 1) + 1)) / strides[0] + 1;
  const int64_t ow = (w + paddings[2] + paddings[3] - (dilations[1] * (kw - 1) + 1)) / strides[1] + 1;
  ConvGeometry g;
  g.src = {n, c, h, w};
  g.dst = {n, oc, oh, ow};
  if (groups > 1) {
    g.weights = {groups, oc / groups, w_shape[1], kh, kw};
    g.weights_tag = tag::goihw;
  } else {
    g.weights = {oc, w_shape[1], kh, kw};
    g.weights_tag = tag::oihw;
  }
  g.strides = {strides[0], strides[1]};
  g.dilations = {dilations[0] - 1, dilations[1] - 1};  // oneDNN counts the holes, Paddle the step
  g.pad_l = {paddings[0], paddings[2]};
  g.pad_r = {paddings[1], paddings[3]};
  g.data_tag = channels_last ? tag::nhwc : tag::nchw;
  g.bf16 = bf16;
  return g;
}

// The three primitive descriptors of one convolution shape. Data stays in Paddle's plain layout
// (no reorders of activations); filters use the layout oneDNN prefers and are reordered, which
// is cheap next to the convolution.
struct ConvPrimitives {
  dnnl::convolution_forward::primitive_desc forward;
  dnnl::convolution_backward_data::primitive_desc backward_data;
  dnnl::convolution_backward_weights::primitive_desc backward_weights;
  dnnl::convolution_forward forward_prim;
  dnnl::convolution_backward_data backward_data_prim;
  dnnl::convolution_backward_weights backward_weights_prim;
};

const ConvPrimitives& primitives(const ConvGeometry& g) {
  std::ostringstream key;
  for (const auto* dims : {&g.src, &g.weights, &g.dst, &g.strides, &g.dilations, &g.pad_l, &g.pad_r}) {
    for (auto d : *dims) key << d << ',';
    key << ';';
  }
  key << static_cast<int>(g.data_tag) << ';' << g.bf16;
  return cached<ConvPrimitives>(key.str(), [&] {
    auto& engine = cpu_engine();
    const auto f32 = memory::data_type::f32;
    const auto compute = g.bf16 ? memory::data_type::bf16 : f32;
    // bf16: inputs, filters and incoming gradients in bf16; everything the op returns in f32.
    memory::desc src(g.src, compute, g.data_tag), src_f32(g.src, f32, g.data_tag);
    memory::desc dst(g.dst, compute, g.data_tag), dst_f32(g.dst, f32, g.data_tag);
    memory::desc weights(g.weights, compute, tag::any), weights_f32(g.weights, f32, tag::any);
    const auto algo = dnnl::algorithm::convolution_direct;
    auto forward = dnnl::convolution_forward::primitive_desc(
        engine, dnnl::prop_kind::forward_training, algo, src, weights, dst_f32, g.strides, g.dilations, g.pad_l,
        g.pad_r);
    auto backward_data = dnnl::convolution_backward_data::primitive_desc(
        engine, algo, src_f32, weights, dst, g.strides, g.dilations, g.pad_l, g.pad_r, forward);
    auto backward_weights = dnnl::convolution_backward_weights::primitive_desc(
        engine, algo, src, weights_f32, dst, g.strides, g.dilations, g.pad_l, g.pad_r, forward);
    return ConvPrimitives{forward, backward_data, backward_weights, dnnl::convolution_forward(forward),
                          dnnl::convolution_backward_data(backward_data),
                          dnnl::convolution_backward_weights(backward_weights)};
  });
}

// `user` reordered into `wanted` if the layouts differ.
memory as_layout(const memory& user, const memory::desc& wanted, dnnl::stream& stream) {
  if (user.get_desc() == wanted) return user;
  memory converted(wanted, cpu_engine());
  dnnl::reorder(user, converted).execute(stream, const_cast<memory&>(user), converted);
  return converted;
}

void check_inputs(const paddle::Tensor& x, const paddle::Tensor& w) {
  PD_CHECK(x.is_cpu() && w.is_cpu(), "ppdlx onednn conv2d runs on CPU tensors only");
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32 && w.dtype() == paddle::DataType::FLOAT32,
           "ppdlx onednn conv2d: float32 only");
  PD_CHECK(x.is_contiguous() && w.is_contiguous(), "ppdlx onednn conv2d: contiguous tensors expected");
}

}  // namespace

std::vector<paddle::Tensor> OneDNNConv2dForward(const paddle::Tensor& x, const paddle::Tensor& w,
                                                const std::vector<int>& strides,
                                                const std::vector<int>& paddings,
                                                const std::vector<int>& dilations, int groups,
                                                bool channels_last, bool need_input_grad, bool bf16) {
  check_inputs(x, w);
  const auto g = geometry(x.shape(), w.shape(), strides, paddings, dilations, groups, channels_last, bf16);
  const auto& p = primitives(g);
  auto out = paddle::empty(paddle_shape(g.dst, channels_last), paddle::DataType::FLOAT32, paddle::CPUPlace());
  dnnl::stream stream(cpu_engine());
  auto src = as_layout(plain(g.src, g.data_tag, x), p.forward.src_desc(), stream);
  auto weights = as_layout(plain(g.weights, g.weights_tag, w), p.forward.weights_desc(), stream);
  auto dst = plain(g.dst, g.data_tag, out);
  p.forward_prim.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}});
  stream.wait();
  return {out};
}

std::vector<paddle::Tensor> OneDNNConv2dBackward(const paddle::Tensor& x, const paddle::Tensor& w,
                                                 const paddle::Tensor& grad_out,
                                                 const std::vector<int>& strides,
                                                 const std::vector<int>& paddings,
                                                 const std::vector<int>& dilations, int groups,
                                                 bool channels_last, bool need_input_grad, bool bf16) {
  check_inputs(x, w);
  const auto g = geometry(x.shape(), w.shape(), strides, paddings, dilations, groups, channels_last, bf16);
  const auto& p = primitives(g);
  auto grad_out_c = grad_out.is_contiguous() ? grad_out : grad_out.contiguous();
  auto grad_x = paddle::empty(x.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  auto grad_w = paddle::empty(w.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  dnnl::stream stream(cpu_engine());
  auto diff_dst = as_layout(plain(g.dst, g.data_tag, grad_out_c), p.backward_weights.diff_dst_desc(), stream);
  if (need_input_grad) {
    // Skipped for network inputs (stop_gradient): Paddle discards that gradient anyway.
    auto weights = as_layout(plain(g.weights, g.weights_tag, w), p.backward_data.weights_desc(), stream);
    auto diff_src = plain(g.src, g.data_tag, grad_x);
    p.backward_data_prim.execute(
        stream, {{DNNL_ARG_DIFF_DST, as_layout(diff_dst, p.backward_data.diff_dst_desc(), stream)},
                 {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DIFF_SRC, diff_src}});
  }
  auto src = as_layout(plain(g.src, g.data_tag, x), p.backward_weights.src_desc(), stream);
  auto user_diff_weights = plain(g.weights, g.weights_tag, grad_w);
  const auto wanted = p.backward_weights.diff_weights_desc();
  memory diff_weights = wanted == user_diff_weights.get_desc() ? user_diff_weights : memory(wanted, cpu_engine());
  p.backward_weights_prim.execute(
      stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_WEIGHTS, diff_weights}});
  if (diff_weights != user_diff_weights) {
    dnnl::reorder(diff_weights, user_diff_weights).execute(stream, diff_weights, user_diff_weights);
  }
  stream.wait();
  return {grad_x, grad_w};
}

std::vector<std::vector<int64_t>> OneDNNConv2dInferShape(const std::vector<int64_t>& x_shape,
                                                         const std::vector<int64_t>& w_shape,
                                                         const std::vector<int>& strides,
                                                         const std::vector<int>& paddings,
                                                         const std::vector<int>& dilations, int groups,
                                                         bool channels_last, bool need_input_grad, bool bf16) {
  const auto g = geometry(x_shape, w_shape, strides, paddings, dilations, groups, channels_last);
  return {paddle_shape(g.dst, channels_last)};
}

std::vector<paddle::DataType> OneDNNConv2dInferDtype(const paddle::DataType& x_dtype,
                                                     const paddle::DataType& w_dtype) {
  return {x_dtype};
}

PD_BUILD_OP(ppdlx_onednn_conv2d)
    .Inputs({"X", "Filter"})
    .Outputs({"Out"})
    .Attrs({"strides: std::vector<int>", "paddings: std::vector<int>", "dilations: std::vector<int>",
            "groups: int", "channels_last: bool", "need_input_grad: bool", "bf16: bool"})
    .SetKernelFn(PD_KERNEL(OneDNNConv2dForward))
    .SetInferShapeFn(PD_INFER_SHAPE(OneDNNConv2dInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(OneDNNConv2dInferDtype));

PD_BUILD_GRAD_OP(ppdlx_onednn_conv2d)
    .Inputs({"X", "Filter", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Filter")})
    .Attrs({"strides: std::vector<int>", "paddings: std::vector<int>", "dilations: std::vector<int>",
            "groups: int", "channels_last: bool", "need_input_grad: bool", "bf16: bool"})
    .SetKernelFn(PD_KERNEL(OneDNNConv2dBackward));

// ---------------------------------------------------------------------------------------------
// Training-mode batch normalization with an optional fused ReLU (oneDNN's fuse_norm_relu): one
// pass over the activations instead of Paddle's batch_norm + relu kernels, forward and backward.
// Returns y and the batch mean/variance (biased, like Paddle's); the running statistics are
// updated by the caller. The workspace carries the ReLU mask to the backward pass.
namespace {

struct NormPrimitives {
  dnnl::batch_normalization_forward::primitive_desc forward;
  dnnl::batch_normalization_backward::primitive_desc backward;
  dnnl::batch_normalization_forward forward_prim;
  dnnl::batch_normalization_backward backward_prim;
};

const NormPrimitives& norm_primitives(const memory::dims& dims, bool channels_last, float epsilon,
                                      bool fuse_relu) {
  std::ostringstream key;
  for (auto d : dims) key << d << ',';
  key << channels_last << ';' << epsilon << ';' << fuse_relu;
  return cached<NormPrimitives>(key.str(), [&] {
    auto& engine = cpu_engine();
    memory::desc data(dims, memory::data_type::f32, channels_last ? tag::nhwc : tag::nchw);
    auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
    if (fuse_relu) flags = flags | dnnl::normalization_flags::fuse_norm_relu;
    auto forward = dnnl::batch_normalization_forward::primitive_desc(
        engine, dnnl::prop_kind::forward_training, data, data, epsilon, flags);
    auto backward = dnnl::batch_normalization_backward::primitive_desc(
        engine, dnnl::prop_kind::backward, data, data, data, epsilon, flags, forward);
    return NormPrimitives{forward, backward, dnnl::batch_normalization_forward(forward),
                          dnnl::batch_normalization_backward(backward)};
  });
}

memory vec(const paddle::Tensor& t) {
  return memory({{t.numel()}, memory::data_type::f32, tag::x}, cpu_engine(), const_cast<float*>(t.data<float>()));
}

}  // namespace

std::vector<paddle::Tensor> OneDNNBatchNormForward(const paddle::Tensor& x, const paddle::Tensor& scale,
                                                   const paddle::Tensor& shift, float epsilon,
                                                   bool channels_last, bool fuse_relu) {
  PD_CHECK(x.is_cpu() && x.dtype() == paddle::DataType::FLOAT32 && x.is_contiguous(),
           "ppdlx onednn batch_norm: contiguous float32 CPU input expected");
  const auto dims = dnnl_dims(x.shape(), channels_last);
  const auto& p = norm_primitives(dims, channels_last, epsilon, fuse_relu);
  auto y = paddle::empty(x.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  auto mean = paddle::empty({dims[1]}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  auto variance = paddle::empty({dims[1]}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  const int64_t workspace_bytes = fuse_relu ? static_cast<int64_t>(p.forward.workspace_desc().get_size()) : 1;
  auto workspace = paddle::empty({workspace_bytes}, paddle::DataType::UINT8, paddle::CPUPlace());
  const auto layout = channels_last ? tag::nhwc : tag::nchw;
  dnnl::stream stream(cpu_engine());
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, plain(dims, layout, x)}, {DNNL_ARG_DST, plain(dims, layout, y)},
      {DNNL_ARG_SCALE, vec(scale)}, {DNNL_ARG_SHIFT, vec(shift)},
      {DNNL_ARG_MEAN, vec(mean)}, {DNNL_ARG_VARIANCE, vec(variance)}};
  if (fuse_relu) {
    args.insert({DNNL_ARG_WORKSPACE, memory(p.forward.workspace_desc(), cpu_engine(), workspace.data<uint8_t>())});
  }
  p.forward_prim.execute(stream, args);
  stream.wait();
  return {y, mean, variance, workspace};
}

std::vector<paddle::Tensor> OneDNNBatchNormBackward(const paddle::Tensor& x, const paddle::Tensor& scale,
                                                    const paddle::Tensor& mean, const paddle::Tensor& variance,
                                                    const paddle::Tensor& workspace, const paddle::Tensor& grad_y,
                                                    float epsilon, bool channels_last, bool fuse_relu) {
  const auto dims = dnnl_dims(x.shape(), channels_last);
  const auto& p = norm_primitives(dims, channels_last, epsilon, fuse_relu);
  auto grad_y_c = grad_y.is_contiguous() ? grad_y : grad_y.contiguous();
  auto grad_x = paddle::empty(x.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  auto grad_scale = paddle::empty({dims[1]}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  auto grad_shift = paddle::empty({dims[1]}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  const auto layout = channels_last ? tag::nhwc : tag::nchw;
  auto data = [&](const paddle::Tensor& t) { return plain(dims, layout, t); };
  dnnl::stream stream(cpu_engine());
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, data(x)}, {DNNL_ARG_DIFF_DST, data(grad_y_c)}, {DNNL_ARG_DIFF_SRC, data(grad_x)},
      {DNNL_ARG_MEAN, vec(mean)}, {DNNL_ARG_VARIANCE, vec(variance)}, {DNNL_ARG_SCALE, vec(scale)},
      {DNNL_ARG_DIFF_SCALE, vec(grad_scale)}, {DNNL_ARG_DIFF_SHIFT, vec(grad_shift)}};
  if (fuse_relu) {
    args.insert({DNNL_ARG_WORKSPACE, memory(p.forward.workspace_desc(), cpu_engine(),
                                            const_cast<uint8_t*>(workspace.data<uint8_t>()))});
  }
  p.backward_prim.execute(stream, args);
  stream.wait();
  return {grad_x, grad_scale, grad_shift};
}

std::vector<std::vector<int64_t>> OneDNNBatchNormInferShape(const std::vector<int64_t>& x_shape,
                                                            const std::vector<int64_t>& scale_shape,
                                                            const std::vector<int64_t>& shift_shape) {
  return {x_shape, scale_shape, scale_shape, {-1}};
}

std::vector<paddle::DataType> OneDNNBatchNormInferDtype(const paddle::DataType& x_dtype,
                                                        const paddle::DataType& scale_dtype,
                                                        const paddle::DataType& shift_dtype) {
  return {x_dtype, scale_dtype, scale_dtype, paddle::DataType::UINT8};
}

PD_BUILD_OP(ppdlx_onednn_batch_norm)
    .Inputs({"X", "Scale", "Bias"})
    .Outputs({"Y", "SavedMean", "SavedVariance", "Workspace"})
    .Attrs({"epsilon: float", "channels_last: bool", "fuse_relu: bool"})
    .SetKernelFn(PD_KERNEL(OneDNNBatchNormForward))
    .SetInferShapeFn(PD_INFER_SHAPE(OneDNNBatchNormInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(OneDNNBatchNormInferDtype));

PD_BUILD_GRAD_OP(ppdlx_onednn_batch_norm)
    .Inputs({"X", "Scale", "SavedMean", "SavedVariance", "Workspace", paddle::Grad("Y")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Scale"), paddle::Grad("Bias")})
    .Attrs({"epsilon: float", "channels_last: bool", "fuse_relu: bool"})
    .SetKernelFn(PD_KERNEL(OneDNNBatchNormBackward));

// ---------------------------------------------------------------------------------------------
// Max pooling (floor mode, symmetric zero padding semantics of Paddle: padded cells never win).
// Paddle's CPU max pool + its gradient take ~100 ms per ResNet50 step at 128 px; oneDNN's a few.
// The workspace (argmax of every output) carries the choice to the backward pass.
namespace {

struct PoolPrimitives {
  dnnl::pooling_forward::primitive_desc forward;
  dnnl::pooling_backward::primitive_desc backward;
  dnnl::pooling_forward forward_prim;
  dnnl::pooling_backward backward_prim;
  memory::dims src, dst;
  tag layout;
};

memory::dims pool_dst_dims(const memory::dims& src, const std::vector<int>& kernel,
                           const std::vector<int>& strides, const std::vector<int>& paddings) {
  return {src[0], src[1], (src[2] + paddings[0] + paddings[1] - kernel[0]) / strides[0] + 1,
          (src[3] + paddings[2] + paddings[3] - kernel[1]) / strides[1] + 1};
}

const PoolPrimitives& pool_primitives(const std::vector<int64_t>& x_shape, const std::vector<int>& kernel,
                                      const std::vector<int>& strides, const std::vector<int>& paddings,
                                      bool channels_last) {
  PD_CHECK(x_shape.size() == 4 && kernel.size() == 2 && strides.size() == 2 && paddings.size() == 4,
           "ppdlx onednn max_pool2d: 4-D input, 2 kernel sizes, 2 strides and 4 paddings expected");
  std::ostringstream key;
  for (auto d : x_shape) key << d << ',';
  for (const auto* v : {&kernel, &strides, &paddings}) {
    for (auto d : *v) key << d << ',';
    key << ';';
  }
  key << channels_last;
  return cached<PoolPrimitives>(key.str(), [&] {
    const auto src = dnnl_dims(x_shape, channels_last);
    const auto dst = pool_dst_dims(src, kernel, strides, paddings);
    const auto layout = channels_last ? tag::nhwc : tag::nchw;
    memory::desc src_md(src, memory::data_type::f32, layout), dst_md(dst, memory::data_type::f32, layout);
    auto& engine = cpu_engine();
    const memory::dims k{kernel[0], kernel[1]}, s{strides[0], strides[1]}, dil{0, 0};
    const memory::dims pl{paddings[0], paddings[2]}, pr{paddings[1], paddings[3]};
    auto forward = dnnl::pooling_forward::primitive_desc(engine, dnnl::prop_kind::forward_training,
                                                         dnnl::algorithm::pooling_max, src_md, dst_md, s, k, dil, pl,
                                                         pr);
    auto backward = dnnl::pooling_backward::primitive_desc(engine, dnnl::algorithm::pooling_max, src_md, dst_md, s,
                                                           k, dil, pl, pr, forward);
    return PoolPrimitives{forward, backward, dnnl::pooling_forward(forward), dnnl::pooling_backward(backward),
                          src, dst, layout};
  });
}

}  // namespace

std::vector<paddle::Tensor> OneDNNMaxPoolForward(const paddle::Tensor& x, const std::vector<int>& kernel,
                                                 const std::vector<int>& strides, const std::vector<int>& paddings,
                                                 bool channels_last) {
  PD_CHECK(x.is_cpu() && x.dtype() == paddle::DataType::FLOAT32 && x.is_contiguous(),
           "ppdlx onednn max_pool2d: contiguous float32 CPU input expected");
  const auto& p = pool_primitives(x.shape(), kernel, strides, paddings, channels_last);
  auto y = paddle::empty(paddle_shape(p.dst, channels_last), paddle::DataType::FLOAT32, paddle::CPUPlace());
  auto workspace = paddle::empty({static_cast<int64_t>(p.forward.workspace_desc().get_size())},
                                 paddle::DataType::UINT8, paddle::CPUPlace());
  dnnl::stream stream(cpu_engine());
  p.forward_prim.execute(
      stream, {{DNNL_ARG_SRC, plain(p.src, p.layout, x)},
               {DNNL_ARG_DST, plain(p.dst, p.layout, y)},
               {DNNL_ARG_WORKSPACE, memory(p.forward.workspace_desc(), cpu_engine(), workspace.data<uint8_t>())}});
  stream.wait();
  return {y, workspace};
}

std::vector<paddle::Tensor> OneDNNMaxPoolBackward(const paddle::Tensor& x, const paddle::Tensor& workspace,
                                                  const paddle::Tensor& grad_y, const std::vector<int>& kernel,
                                                  const std::vector<int>& strides, const std::vector<int>& paddings,
                                                  bool channels_last) {
  const auto& p = pool_primitives(x.shape(), kernel, strides, paddings, channels_last);
  auto grad_y_c = grad_y.is_contiguous() ? grad_y : grad_y.contiguous();
  auto grad_x = paddle::empty(x.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  dnnl::stream stream(cpu_engine());
  p.backward_prim.execute(
      stream, {{DNNL_ARG_DIFF_DST, plain(p.dst, p.layout, grad_y_c)},
               {DNNL_ARG_DIFF_SRC, plain(p.src, p.layout, grad_x)},
               {DNNL_ARG_WORKSPACE, memory(p.forward.workspace_desc(), cpu_engine(),
                                           const_cast<uint8_t*>(workspace.data<uint8_t>()))}});
  stream.wait();
  return {grad_x};
}

std::vector<std::vector<int64_t>> OneDNNMaxPoolInferShape(const std::vector<int64_t>& x_shape,
                                                          const std::vector<int>& kernel,
                                                          const std::vector<int>& strides,
                                                          const std::vector<int>& paddings, bool channels_last) {
  const auto dst = pool_dst_dims(dnnl_dims(x_shape, channels_last), kernel, strides, paddings);
  return {paddle_shape(dst, channels_last), {-1}};
}

std::vector<paddle::DataType> OneDNNMaxPoolInferDtype(const paddle::DataType& x_dtype) {
  return {x_dtype, paddle::DataType::UINT8};
}

PD_BUILD_OP(ppdlx_onednn_max_pool2d)
    .Inputs({"X"})
    .Outputs({"Y", "Workspace"})
    .Attrs({"kernel: std::vector<int>", "strides: std::vector<int>", "paddings: std::vector<int>",
            "channels_last: bool"})
    .SetKernelFn(PD_KERNEL(OneDNNMaxPoolForward))
    .SetInferShapeFn(PD_INFER_SHAPE(OneDNNMaxPoolInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(OneDNNMaxPoolInferDtype));

PD_BUILD_GRAD_OP(ppdlx_onednn_max_pool2d)
    .Inputs({"X", "Workspace", paddle::Grad("Y")})
    .Outputs({paddle::Grad("X")})
    .Attrs({"kernel: std::vector<int>", "strides: std::vector<int>", "paddings: std::vector<int>",
            "channels_last: bool"})
    .SetKernelFn(PD_KERNEL(OneDNNMaxPoolBackward));
