from setuptools import find_packages, setup

# Paddle is deliberately not in install_requires. The CPU build (`paddlepaddle`) and the CUDA build
# (`paddlepaddle-gpu`) are two distributions of the same `paddle` package; naming either one makes pip
# install it next to (and over) the other, e.g. the CPU wheel over a GPU image's Paddle. Install the
# build you want first, or `pip install ".[cpu]"`; `import ppdlx` says so in one line when Paddle is missing.
PADDLE_CPU = "paddlepaddle==3.3.1"  # the version requirements.txt pins and the code is verified against

setup(
    name="ppdlx",
    version="0.1.0",
    description="PaddlePaddle-native training, 2:4 sparsity, export and deployment of ResNet50 v1.5, "
                "GPUNet and EfficientDet-D0",
    # ppdlx_deploy (deploy/python) ships too, so an installed ppdlx can serve and benchmark its exports; it imports
    # no ppdlx and stays runnable from a bare deploy/ copy.
    packages=find_packages(include=["ppdlx", "ppdlx.*"]) + ["ppdlx_deploy"],
    package_dir={"ppdlx_deploy": "deploy/python/ppdlx_deploy"},
    entry_points={"console_scripts": ["ppdlx-deploy-infer = ppdlx_deploy.cli:run"]},
    package_data={"ppdlx": ["models/gpunet_archs/*.json", "ops/*.cc", "ops/*.h"]},
    python_requires=">=3.9",
    install_requires=[
        "numpy<2.4",          # Paddle 3.3's loss scaler calls float() on a 1-element array (ppdlx.engine.amp)
        "pillow",
        "pyyaml",
        "pydantic>=2",
        "scikit-learn",       # the embedded digits demo data
    ],
    extras_require={
        "cpu": [PADDLE_CPU],
        "dali": ["nvidia-dali-cuda120"],  # DALI's build for CUDA 12.x (its CPU pipelines need no GPU)
        "onnx": ["paddle2onnx", "onnxruntime"],
        # a third CPU runtime for deploy's --backend auto / openvino (it reads the ONNX export)
        "openvino": ["openvino"],
        "coco": ["pycocotools"],
        # figures (curves.png, confusion.png, ...; ppdlx.analysis): training and every report work without it
        "plot": ["matplotlib"],
        "test": ["pytest", "pycocotools", "paddle2onnx", "onnxruntime", "nvidia-dali-cuda120", "matplotlib"],
    },
)
