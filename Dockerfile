# ppdlx on Paddle's official GPU image with TensorRT (Paddle-TRT deployment needs libnvinfer).
# Build:  docker build -t ppdlx .
# Run:    docker run --gpus all --ipc=host -v /data/imagenet:/workspace/ppdlx/data/imagenet ppdlx \
#           python -m paddle.distributed.launch --devices 0,1,2,3,4,5,6,7 tools/train.py -c configs/rn50_amp.yaml
#
# Base tag: CUDA 12.6, cuDNN 9.5, TensorRT 10.5 (the -trt10.5 suffix), Paddle 3.0.0 GPU.
#   What was checked: Paddle's own 3.x install pages (PaddleX / PaddleOCR "PaddlePaddle installation") name this
#   tag as the CUDA 12.6 GPU image; it is the newest Paddle tag found that names TensorRT. The 3.1-3.3 GPU tags
#   found (e.g. 3.3.1-gpu-cuda12.9-cudnn9.9) have no -trt suffix, so TensorRT in them is not known.
#   Not checked (no Docker, no GPU here): pulling the tag, its Python version, and whether the TensorRT 10.5
#   libraries match the TensorRT that paddlepaddle-gpu 3.3.1 was compiled against (docs/gpu.md).
FROM paddlepaddle/paddle:3.0.0-gpu-cuda12.6-cudnn9.5-trt10.5

# ppdlx is verified against Paddle 3.3.1, so the image's GPU Paddle is moved to 3.3.1's CUDA 12.6 GPU build
# (a GPU build over a GPU build; the cu126 index matches the tag's CUDA 12.6).
ARG PADDLE_GPU_VERSION=3.3.1
RUN python -m pip install --no-cache-dir "paddlepaddle-gpu==${PADDLE_GPU_VERSION}" \
        -i https://www.paddlepaddle.org.cn/packages/stable/cu126/

WORKDIR /workspace/ppdlx
COPY . .
# setup.py names no Paddle distribution, so this cannot pull the CPU `paddlepaddle` over the GPU one.
# [dali] is nvidia-dali-cuda120: DALI's build for CUDA 12.x, the image's CUDA major version.
RUN python -m pip install --no-cache-dir -e ".[dali,onnx,coco]"

# Fail the build, not the first run, if the CPU wheel got in, the GPU Paddle has no TensorRT support, the
# image's TensorRT is not the one Paddle was compiled against, or paddle.tensorrt (the route of the default .json
# export to TensorRT; it imports NVIDIA's `tensorrt` Python module) cannot be imported.
RUN python -c "import importlib.metadata as md, paddle, paddle.inference as pi; \
names = {(d.metadata['Name'] or '').lower() for d in md.distributions()}; \
assert 'paddlepaddle' not in names, 'the CPU paddlepaddle wheel is installed next to paddlepaddle-gpu'; \
assert paddle.is_compiled_with_cuda(), 'Paddle is a CPU build'; \
compiled, runtime = tuple(pi.get_trt_compile_version()), tuple(pi.get_trt_runtime_version()); \
assert compiled[0] > 0, 'Paddle was compiled without TensorRT'; \
assert runtime[:2] == compiled[:2], f'TensorRT {runtime} in the image, Paddle was compiled against {compiled}'; \
import paddle.tensorrt"
