from setuptools import find_packages, setup

setup(
    name="ppdlx",
    version="0.1.0",
    description="PaddlePaddle-native training, 2:4 sparsity, export and deployment of ResNet50 v1.5, "
                "GPUNet and EfficientDet-D0",
    packages=find_packages(include=["ppdlx", "ppdlx.*"]),
    package_data={"ppdlx": ["models/gpunet_archs/*.json", "ops/*.cc"]},
    python_requires=">=3.9",
    install_requires=[
        "paddlepaddle>=3.0",  # or paddlepaddle-gpu: install the build for your CUDA first
        "numpy",
        "pillow",
        "pyyaml",
        "pydantic>=2",
        "scikit-learn",       # the embedded digits demo data
    ],
    extras_require={
        "dali": ["nvidia-dali-cuda120"],
        "onnx": ["paddle2onnx", "onnxruntime"],
        "coco": ["pycocotools"],
        "test": ["pytest", "pycocotools", "paddle2onnx", "onnxruntime", "nvidia-dali-cuda120"],
    },
)
