// 2-D convolution (forward, input and filter gradients) on CPU through oneDNN, as a Paddle custom op.
//
// Why: Paddle 3.3.1's CPU conv2d kernels are im2col + one GEMM per sample, and its NHWC kernels
// transpose to NCHW inside; they are ~80 % of a ResNet50 training step. The oneDNN library that
// ships in Paddle's wheel (paddle/libs/libdnnl.so.3) has batched direct kernels for both layouts,
// but dygraph never dispatches to them. Tensors keep Paddle's plain layouts (NCHW or NHWC data,
// [O, I/groups, kh, kw] filters), so the op is a drop-in for paddle.nn.functional.conv2d.
// With `bf16` the convolution computes in bfloat16 (inputs, filters and incoming gradients rounded
// to bf16 inside the op; outputs and gradients float32, so float32 master weights and every other
// op are untouched): what PyTorch's CPU autocast does, for CPUs with bf16 hardware. With `out_bf16`
// as well the output (and so its incoming gradient) is a bfloat16 tensor, and a bfloat16 input gets
// a bfloat16 gradient: activations then stay bf16 between ppdlx's ops (batch norm, add + ReLU, max
// pool take either type), with no float32 copy of them written or rounded again.
#include "onednn_common.h"

using namespace ppdlx_onednn;

namespace {

struct ConvGeometry {
  memory::dims src, weights, dst, strides, dilations, pad_l, pad_r;
  tag data_tag, weights_tag;
  bool bf16 = false, x_bf16 = false, out_bf16 = false;
};

// Builds the geometry from Paddle shapes. paddings = {top, bottom, left, right}.
ConvGeometry geometry(const std::vector<int64_t>& x_shape, const std::vector<int64_t>& w_shape,
                      const std::vector<int>& strides, const std::vector<int>& paddings,
                      const std::vector<int>& dilations, int groups, bool channels_last, bool bf16 = false,
                      bool x_bf16 = false, bool out_bf16 = false) {
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
  PD_CHECK(bf16 || !(x_bf16 || out_bf16), "ppdlx onednn conv2d: bfloat16 tensors need bf16=True");
  g.bf16 = bf16;
  g.x_bf16 = x_bf16;
  g.out_bf16 = out_bf16;
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
  key << static_cast<int>(g.data_tag) << ';' << g.bf16 << g.x_bf16 << g.out_bf16;
  return cached<ConvPrimitives>(key.str(), [&] {
    auto& engine = cpu_engine();
    const auto f32 = memory::data_type::f32;
    const auto compute = g.bf16 ? memory::data_type::bf16 : f32;
    // bf16: inputs, filters and incoming gradients in bf16; the output in bf16 with out_bf16 (else
    // f32), the input's gradient in the input's type, the filter's gradient in f32.
    memory::desc src(g.src, compute, g.data_tag), diff_src(g.src, dnnl_type(g.x_bf16), g.data_tag);
    memory::desc dst(g.dst, compute, g.data_tag), out(g.dst, dnnl_type(g.out_bf16), g.data_tag);
    memory::desc weights(g.weights, compute, tag::any), weights_f32(g.weights, f32, tag::any);
    const auto algo = dnnl::algorithm::convolution_direct;
    auto forward = dnnl::convolution_forward::primitive_desc(
        engine, dnnl::prop_kind::forward_training, algo, src, weights, out, g.strides, g.dilations, g.pad_l,
        g.pad_r);
    auto backward_data = dnnl::convolution_backward_data::primitive_desc(
        engine, algo, diff_src, weights, dst, g.strides, g.dilations, g.pad_l, g.pad_r, forward);
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
  check_activation(x, "conv2d");
  PD_CHECK(w.is_cpu() && w.dtype() == paddle::DataType::FLOAT32 && w.is_contiguous(),
           "ppdlx onednn conv2d: contiguous float32 CPU filter expected");
}

}  // namespace

std::vector<paddle::Tensor> OneDNNConv2dForward(const paddle::Tensor& x, const paddle::Tensor& w,
                                                const std::vector<int>& strides,
                                                const std::vector<int>& paddings,
                                                const std::vector<int>& dilations, int groups,
                                                bool channels_last, bool need_input_grad, bool bf16,
                                                bool out_bf16) {
  return guarded("conv2d", bf16 || is_bf16(x) || out_bf16, [&]() -> std::vector<paddle::Tensor> {
    check_inputs(x, w);
    const auto g = geometry(x.shape(), w.shape(), strides, paddings, dilations, groups, channels_last, bf16,
                            is_bf16(x), out_bf16);
    const auto& p = primitives(g);
    auto out = paddle::empty(paddle_shape(g.dst, channels_last), paddle_type(out_bf16), paddle::CPUPlace());
    dnnl::stream stream(cpu_engine());
    auto src = as_layout(plain(g.src, g.data_tag, x), p.forward.src_desc(), stream);
    auto weights = as_layout(plain(g.weights, g.weights_tag, w), p.forward.weights_desc(), stream);
    auto dst = plain(g.dst, g.data_tag, out);
    p.forward_prim.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}});
    stream.wait();
    return {out};
  });
}

std::vector<paddle::Tensor> OneDNNConv2dBackward(const paddle::Tensor& x, const paddle::Tensor& w,
                                                 const paddle::Tensor& grad_out,
                                                 const std::vector<int>& strides,
                                                 const std::vector<int>& paddings,
                                                 const std::vector<int>& dilations, int groups,
                                                 bool channels_last, bool need_input_grad, bool bf16,
                                                 bool out_bf16) {
  return guarded("conv2d (backward)", bf16 || is_bf16(x) || out_bf16, [&]() -> std::vector<paddle::Tensor> {
    check_inputs(x, w);
    const auto g = geometry(x.shape(), w.shape(), strides, paddings, dilations, groups, channels_last, bf16,
                            is_bf16(x), out_bf16);
    const auto& p = primitives(g);
    auto grad_out_c = grad_out.is_contiguous() ? grad_out : grad_out.contiguous();
    PD_CHECK(is_bf16(grad_out_c) == out_bf16, "ppdlx onednn conv2d: the output's gradient changed type");
    auto grad_x = paddle::empty(x.shape(), x.dtype(), paddle::CPUPlace());
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
  });
}

std::vector<std::vector<int64_t>> OneDNNConv2dInferShape(const std::vector<int64_t>& x_shape,
                                                         const std::vector<int64_t>& w_shape,
                                                         const std::vector<int>& strides,
                                                         const std::vector<int>& paddings,
                                                         const std::vector<int>& dilations, int groups,
                                                         bool channels_last, bool need_input_grad, bool bf16,
                                                         bool out_bf16) {
  const auto g = geometry(x_shape, w_shape, strides, paddings, dilations, groups, channels_last);
  return {paddle_shape(g.dst, channels_last)};
}

std::vector<paddle::DataType> OneDNNConv2dInferDtype(const paddle::DataType& x_dtype,
                                                     const paddle::DataType& w_dtype,
                                                     const std::vector<int>& strides,
                                                     const std::vector<int>& paddings,
                                                     const std::vector<int>& dilations, int groups,
                                                     bool channels_last, bool need_input_grad, bool bf16,
                                                     bool out_bf16) {
  return {paddle_type(out_bf16)};
}

PD_BUILD_OP(ppdlx_onednn_conv2d)
    .Inputs({"X", "Filter"})
    .Outputs({"Out"})
    .Attrs({"strides: std::vector<int>", "paddings: std::vector<int>", "dilations: std::vector<int>",
            "groups: int", "channels_last: bool", "need_input_grad: bool", "bf16: bool", "out_bf16: bool"})
    .SetKernelFn(PD_KERNEL(OneDNNConv2dForward))
    .SetInferShapeFn(PD_INFER_SHAPE(OneDNNConv2dInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(OneDNNConv2dInferDtype));

PD_BUILD_GRAD_OP(ppdlx_onednn_conv2d)
    .Inputs({"X", "Filter", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Filter")})
    .Attrs({"strides: std::vector<int>", "paddings: std::vector<int>", "dilations: std::vector<int>",
            "groups: int", "channels_last: bool", "need_input_grad: bool", "bf16: bool", "out_bf16: bool"})
    .SetKernelFn(PD_KERNEL(OneDNNConv2dBackward));
