# ppdlx on Paddle's official GPU image (CUDA 12.x, cuDNN, TensorRT for Paddle-TRT).
# Build:  docker build -t ppdlx .
# Run:    docker run --gpus all --ipc=host -v /data/imagenet:/workspace/ppdlx/data/imagenet ppdlx \
#           python -m paddle.distributed.launch --devices 0,1,2,3,4,5,6,7 tools/train.py -c configs/rn50_amp.yaml
FROM paddlepaddle/paddle:3.3.1-gpu-cuda12.6-cudnn9.5
WORKDIR /workspace/ppdlx
COPY . .
RUN python -m pip install --no-cache-dir -e ".[dali,onnx,coco]"
