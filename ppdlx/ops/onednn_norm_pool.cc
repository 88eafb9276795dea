// Batch norm (+ ReLU), max pooling and add + ReLU on CPU through oneDNN, as Paddle custom ops, for
// float32 or bfloat16 activations; the convolution and why these ops exist: onednn_kernels.cc.
#include "onednn_common.h"

using namespace ppdlx_onednn;

// ---------------------------------------------------------------------------------------------
// Training-mode batch normalization with an optional fused ReLU (oneDNN's fuse_norm_relu): one
// pass over the activations instead of Paddle's batch_norm + relu kernels, forward and backward.
// Returns y and the batch mean/variance (biased, like Paddle's); the running statistics are
// updated by the caller. The workspace carries the ReLU mask to the backward pass. A bfloat16
// input gives a bfloat16 output and input gradient (statistics, scale and shift stay float32).
namespace {

using NormPrimitives = TrainingPrimitives<dnnl::batch_normalization_forward, dnnl::batch_normalization_backward>;

const NormPrimitives& norm_primitives(const memory::dims& dims, bool channels_last, float epsilon,
                                      bool fuse_relu, bool bf16) {
  std::ostringstream key;
  for (auto d : dims) key << d << ',';
  key << channels_last << ';' << epsilon << ';' << fuse_relu << ';' << bf16;
  return cached<NormPrimitives>(key.str(), [&] {
    auto& engine = cpu_engine();
    memory::desc data(dims, dnnl_type(bf16), channels_last ? tag::nhwc : tag::nchw);
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
  return guarded("batch_norm", is_bf16(x), [&]() -> std::vector<paddle::Tensor> {
    check_activation(x, "batch_norm");
    const auto dims = dnnl_dims(x.shape(), channels_last);
    const auto& p = norm_primitives(dims, channels_last, epsilon, fuse_relu, is_bf16(x));
    auto y = paddle::empty(x.shape(), x.dtype(), paddle::CPUPlace());
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
  });
}

std::vector<paddle::Tensor> OneDNNBatchNormBackward(const paddle::Tensor& x, const paddle::Tensor& scale,
                                                    const paddle::Tensor& mean, const paddle::Tensor& variance,
                                                    const paddle::Tensor& workspace, const paddle::Tensor& grad_y,
                                                    float epsilon, bool channels_last, bool fuse_relu) {
  return guarded("batch_norm (backward)", is_bf16(x), [&]() -> std::vector<paddle::Tensor> {
    const auto dims = dnnl_dims(x.shape(), channels_last);
    const auto& p = norm_primitives(dims, channels_last, epsilon, fuse_relu, is_bf16(x));
    auto grad_y_c = grad_y.is_contiguous() ? grad_y : grad_y.contiguous();
    PD_CHECK(grad_y_c.dtype() == x.dtype(), "ppdlx onednn batch_norm: the output's gradient changed type");
    auto grad_x = paddle::empty(x.shape(), x.dtype(), paddle::CPUPlace());
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
  });
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

struct PoolPrimitives : TrainingPrimitives<dnnl::pooling_forward, dnnl::pooling_backward> {
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
                                      bool channels_last, bool bf16) {
  PD_CHECK(x_shape.size() == 4 && kernel.size() == 2 && strides.size() == 2 && paddings.size() == 4,
           "ppdlx onednn max_pool2d: 4-D input, 2 kernel sizes, 2 strides and 4 paddings expected");
  std::ostringstream key;
  for (auto d : x_shape) key << d << ',';
  for (const auto* v : {&kernel, &strides, &paddings}) {
    for (auto d : *v) key << d << ',';
    key << ';';
  }
  key << channels_last << ';' << bf16;
  return cached<PoolPrimitives>(key.str(), [&] {
    const auto src = dnnl_dims(x_shape, channels_last);
    const auto dst = pool_dst_dims(src, kernel, strides, paddings);
    const auto layout = channels_last ? tag::nhwc : tag::nchw;
    memory::desc src_md(src, dnnl_type(bf16), layout), dst_md(dst, dnnl_type(bf16), layout);
    auto& engine = cpu_engine();
    const memory::dims k{kernel[0], kernel[1]}, s{strides[0], strides[1]}, dil{0, 0};
    const memory::dims pl{paddings[0], paddings[2]}, pr{paddings[1], paddings[3]};
    auto forward = dnnl::pooling_forward::primitive_desc(engine, dnnl::prop_kind::forward_training,
                                                         dnnl::algorithm::pooling_max, src_md, dst_md, s, k, dil, pl,
                                                         pr);
    auto backward = dnnl::pooling_backward::primitive_desc(engine, dnnl::algorithm::pooling_max, src_md, dst_md, s,
                                                           k, dil, pl, pr, forward);
    return PoolPrimitives{{forward, backward, dnnl::pooling_forward(forward), dnnl::pooling_backward(backward)},
                          src, dst, layout};
  });
}

}  // namespace

std::vector<paddle::Tensor> OneDNNMaxPoolForward(const paddle::Tensor& x, const std::vector<int>& kernel,
                                                 const std::vector<int>& strides, const std::vector<int>& paddings,
                                                 bool channels_last) {
  return guarded("max_pool2d", is_bf16(x), [&]() -> std::vector<paddle::Tensor> {
    check_activation(x, "max_pool2d");
    const auto& p = pool_primitives(x.shape(), kernel, strides, paddings, channels_last, is_bf16(x));
    auto y = paddle::empty(paddle_shape(p.dst, channels_last), x.dtype(), paddle::CPUPlace());
    auto workspace = paddle::empty({static_cast<int64_t>(p.forward.workspace_desc().get_size())},
                                   paddle::DataType::UINT8, paddle::CPUPlace());
    dnnl::stream stream(cpu_engine());
    p.forward_prim.execute(
        stream, {{DNNL_ARG_SRC, plain(p.src, p.layout, x)},
                 {DNNL_ARG_DST, plain(p.dst, p.layout, y)},
                 {DNNL_ARG_WORKSPACE, memory(p.forward.workspace_desc(), cpu_engine(), workspace.data<uint8_t>())}});
    stream.wait();
    return {y, workspace};
  });
}

std::vector<paddle::Tensor> OneDNNMaxPoolBackward(const paddle::Tensor& x, const paddle::Tensor& workspace,
                                                  const paddle::Tensor& grad_y, const std::vector<int>& kernel,
                                                  const std::vector<int>& strides, const std::vector<int>& paddings,
                                                  bool channels_last) {
  return guarded("max_pool2d (backward)", is_bf16(x), [&]() -> std::vector<paddle::Tensor> {
    const auto& p = pool_primitives(x.shape(), kernel, strides, paddings, channels_last, is_bf16(x));
    auto grad_y_c = grad_y.is_contiguous() ? grad_y : grad_y.contiguous();
    PD_CHECK(grad_y_c.dtype() == x.dtype(), "ppdlx onednn max_pool2d: the output's gradient changed type");
    auto grad_x = paddle::empty(x.shape(), x.dtype(), paddle::CPUPlace());
    dnnl::stream stream(cpu_engine());
    p.backward_prim.execute(
        stream, {{DNNL_ARG_DIFF_DST, plain(p.dst, p.layout, grad_y_c)},
                 {DNNL_ARG_DIFF_SRC, plain(p.src, p.layout, grad_x)},
                 {DNNL_ARG_WORKSPACE, memory(p.forward.workspace_desc(), cpu_engine(),
                                             const_cast<uint8_t*>(workspace.data<uint8_t>()))}});
    stream.wait();
    return {grad_x};
  });
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

// ---------------------------------------------------------------------------------------------
// relu(a + b), the end of a residual block, for float32 or bfloat16 tensors of one shape and type
// (Paddle 3.3.1 has no CPU bfloat16 add or ReLU). The backward masks the incoming gradient where
// the output is zero; both inputs get that gradient.
namespace {

// A 2-D view of `numel` elements: oneDNN's binary kernel ran the same data slower as 1-D
// (docs/cpu_speed.md).
memory::desc flat_desc(int64_t numel, bool bf16) {
  return memory::desc(numel % 64 == 0 ? memory::dims{numel / 64, 64} : memory::dims{numel, 1}, dnnl_type(bf16),
                      tag::ab);
}

struct AddReluPrimitives {
  dnnl::binary add_prim;
  dnnl::eltwise_backward relu_backward_prim;
  memory::desc data;
};

const AddReluPrimitives& add_relu_primitives(int64_t numel, bool bf16) {
  std::ostringstream key;
  key << numel << ';' << bf16;
  return cached<AddReluPrimitives>(key.str(), [&] {
    auto& engine = cpu_engine();
    memory::desc data = flat_desc(numel, bf16);
    dnnl::post_ops relu;
    relu.append_eltwise(dnnl::algorithm::eltwise_relu, 0.f, 0.f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(relu);
    auto add = dnnl::binary::primitive_desc(engine, dnnl::algorithm::binary_add, data, data, data, attr);
    const auto algo = dnnl::algorithm::eltwise_relu_use_dst_for_bwd;
    auto hint = dnnl::eltwise_forward::primitive_desc(engine, dnnl::prop_kind::forward_training, algo, data, data,
                                                      0.f, 0.f);
    auto backward = dnnl::eltwise_backward::primitive_desc(engine, algo, data, data, data, 0.f, 0.f, hint);
    return AddReluPrimitives{dnnl::binary(add), dnnl::eltwise_backward(backward), data};
  });
}

memory flat(const memory::desc& data, const paddle::Tensor& t) {
  return memory(data, cpu_engine(), const_cast<void*>(t.data()));
}

}  // namespace

std::vector<paddle::Tensor> OneDNNAddReluForward(const paddle::Tensor& a, const paddle::Tensor& b) {
  return guarded("add_relu", is_bf16(a), [&]() -> std::vector<paddle::Tensor> {
    check_activation(a, "add_relu");
    check_activation(b, "add_relu");
    PD_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype(), "ppdlx onednn add_relu: same shape and type expected");
    const auto& p = add_relu_primitives(a.numel(), is_bf16(a));
    auto y = paddle::empty(a.shape(), a.dtype(), paddle::CPUPlace());
    dnnl::stream stream(cpu_engine());
    p.add_prim.execute(stream, {{DNNL_ARG_SRC_0, flat(p.data, a)}, {DNNL_ARG_SRC_1, flat(p.data, b)},
                                {DNNL_ARG_DST, flat(p.data, y)}});
    stream.wait();
    return {y};
  });
}

std::vector<paddle::Tensor> OneDNNAddReluBackward(const paddle::Tensor& y, const paddle::Tensor& grad_y) {
  return guarded("add_relu (backward)", is_bf16(y), [&]() -> std::vector<paddle::Tensor> {
    auto grad_y_c = grad_y.is_contiguous() ? grad_y : grad_y.contiguous();
    PD_CHECK(grad_y_c.dtype() == y.dtype(), "ppdlx onednn add_relu: the output's gradient changed type");
    const auto& p = add_relu_primitives(y.numel(), is_bf16(y));
    auto grad_a = paddle::empty(y.shape(), y.dtype(), paddle::CPUPlace());
    auto grad_b = paddle::empty(y.shape(), y.dtype(), paddle::CPUPlace());
    dnnl::stream stream(cpu_engine());
    // Two outputs, not one tensor for both: Paddle may accumulate into a gradient buffer in place.
    for (auto* grad : {&grad_a, &grad_b}) {
      p.relu_backward_prim.execute(stream, {{DNNL_ARG_DST, flat(p.data, y)},
                                            {DNNL_ARG_DIFF_DST, flat(p.data, grad_y_c)},
                                            {DNNL_ARG_DIFF_SRC, flat(p.data, *grad)}});
    }
    stream.wait();
    return {grad_a, grad_b};
  });
}

std::vector<std::vector<int64_t>> OneDNNAddReluInferShape(const std::vector<int64_t>& a_shape,
                                                          const std::vector<int64_t>& b_shape) {
  return {a_shape};
}

std::vector<paddle::DataType> OneDNNAddReluInferDtype(const paddle::DataType& a_dtype,
                                                      const paddle::DataType& b_dtype) {
  return {a_dtype};
}

PD_BUILD_OP(ppdlx_onednn_add_relu)
    .Inputs({"A", "B"})
    .Outputs({"Y"})
    .SetKernelFn(PD_KERNEL(OneDNNAddReluForward))
    .SetInferShapeFn(PD_INFER_SHAPE(OneDNNAddReluInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(OneDNNAddReluInferDtype));

PD_BUILD_GRAD_OP(ppdlx_onednn_add_relu)
    .Inputs({"Y", paddle::Grad("Y")})
    .Outputs({paddle::Grad("A"), paddle::Grad("B")})
    .SetKernelFn(PD_KERNEL(OneDNNAddReluBackward));

// ---------------------------------------------------------------------------------------------
// fork(x) = (x, x) sharing x's buffer, for a tensor read by two ops (a residual block's input:
// its first convolution and its shortcut). Paddle would sum the two incoming gradients itself, and
// for bfloat16 on CPU it does so on one thread, element by element (TensorAdd's Eigen fallback);
// this op's backward sums them with oneDNN's binary add instead.
namespace {

const dnnl::binary& sum_primitive(int64_t numel, bool bf16) {
  std::ostringstream key;
  key << numel << ';' << bf16;
  return cached<dnnl::binary>(key.str(), [&] {
    memory::desc data = flat_desc(numel, bf16);
    return dnnl::binary(dnnl::binary::primitive_desc(cpu_engine(), dnnl::algorithm::binary_add, data, data, data));
  });
}

}  // namespace

std::vector<paddle::Tensor> OneDNNForkForward(const paddle::Tensor& x) {
  check_activation(x, "fork");
  return {x, x};
}

std::vector<paddle::Tensor> OneDNNForkBackward(const paddle::Tensor& grad_a, const paddle::Tensor& grad_b) {
  if (!grad_b.initialized()) return {grad_a};
  if (!grad_a.initialized()) return {grad_b};
  return guarded("fork (backward)", is_bf16(grad_a), [&]() -> std::vector<paddle::Tensor> {
    auto a = grad_a.is_contiguous() ? grad_a : grad_a.contiguous();
    auto b = grad_b.is_contiguous() ? grad_b : grad_b.contiguous();
    PD_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype(),
             "ppdlx onednn fork: the gradients differ in shape or type");
    const memory::desc data = flat_desc(a.numel(), is_bf16(a));
    auto grad_x = paddle::empty(a.shape(), a.dtype(), paddle::CPUPlace());
    dnnl::stream stream(cpu_engine());
    sum_primitive(a.numel(), is_bf16(a)).execute(
        stream, {{DNNL_ARG_SRC_0, flat(data, a)}, {DNNL_ARG_SRC_1, flat(data, b)}, {DNNL_ARG_DST, flat(data, grad_x)}});
    stream.wait();
    return {grad_x};
  });
}

std::vector<std::vector<int64_t>> OneDNNForkInferShape(const std::vector<int64_t>& x_shape) {
  return {x_shape, x_shape};
}

std::vector<paddle::DataType> OneDNNForkInferDtype(const paddle::DataType& x_dtype) { return {x_dtype, x_dtype}; }

PD_BUILD_OP(ppdlx_onednn_fork)
    .Inputs({"X"})
    .Outputs({"A", "B"})
    .SetKernelFn(PD_KERNEL(OneDNNForkForward))
    .SetInferShapeFn(PD_INFER_SHAPE(OneDNNForkInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(OneDNNForkInferDtype));

PD_BUILD_GRAD_OP(ppdlx_onednn_fork)
    .Inputs({paddle::Grad("A"), paddle::Grad("B")})
    .Outputs({paddle::Grad("X")})
    .SetKernelFn(PD_KERNEL(OneDNNForkBackward));
