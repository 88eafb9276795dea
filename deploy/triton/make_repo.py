#!/usr/bin/env python3
"""A Triton Inference Server model repository from a ppdlx export directory (what
tools/export_model.py wrote: the program, weights and inference.yml, plus inference.onnx with --onnx).

    python deploy/triton/make_repo.py --model-dir EXPORT --out REPO [--name NAME] \
        [--backend python|onnxruntime] [--max-batch-size 8] [--instances 1] [--preferred-batch-sizes 4,8] \
        [--queue-delay-us 2000] [--predictor-backend paddle-cpu|auto|onnxruntime|openvino|paddle-gpu|trt] \
        [--precision fp32|fp16|int8] \
        [--threads N] [--topk 5] [--score-threshold T] [--trt-cache-dir DIR] [--int8-calibration-table FILE]

--backend python: one Python-backend model running the export through ppdlx_deploy (Paddle Inference:
oneDNN on CPU; auto, onnxruntime or openvino as deploy/python/infer.py's --backend;
--predictor-backend trt or paddle-gpu on a GPU). --backend onnxruntime: the ONNX export
under Triton's ONNX Runtime backend with TensorRT (--precision), between Python pre- and
post-processing steps, as one ensemble. Either way clients send encoded image files (UINT8
image_bytes) and get top-k classes or boxes back (deploy/README.md, "Triton").
"""
import argparse

from _cli import run  # first: puts ppdlx_triton and ppdlx_deploy on sys.path
from ppdlx_triton.repository import BACKENDS, DEFAULTS, NETWORK_RUNTIMES, PREDICTOR_BACKENDS, make_repository


def batch_sizes(text: str):
    try:
        sizes = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text}: give positive integers, e.g. 4,8")
    return sizes


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True, help="the export directory")
    p.add_argument("--out", required=True, help="the model repository (created; other models in it are kept)")
    p.add_argument("--name", help="model name (default: the model's name in inference.yml)")
    p.add_argument("--backend", choices=BACKENDS, default=DEFAULTS["backend"])
    p.add_argument("--max-batch-size", type=int, default=DEFAULTS["max_batch_size"])
    p.add_argument("--instances", type=int, default=DEFAULTS["instances"],
                   help="model instances (Python backend: processes sharing the cores)")
    p.add_argument("--preferred-batch-sizes", type=batch_sizes, help="dynamic batcher (default: max batch size)")
    p.add_argument("--queue-delay-us", type=int, default=DEFAULTS["queue_delay_us"],
                   help="how long the dynamic batcher waits to fill a batch")
    p.add_argument("--predictor-backend", choices=PREDICTOR_BACKENDS, default=DEFAULTS["predictor_backend"],
                   help="--backend python: ppdlx_deploy's backend (paddle-gpu and trt need a GPU instance)")
    p.add_argument("--precision", default=DEFAULTS["precision"],
                   help="python: as deploy/python/infer.py; onnxruntime: the TensorRT precision fp32|fp16|int8")
    p.add_argument("--threads", type=int, help="CPU threads per instance (default: the cores / instances)")
    p.add_argument("--topk", type=int, default=DEFAULTS["topk"], help="classification: classes returned")
    p.add_argument("--score-threshold", type=float,
                   help="detection: keep boxes at or above this score (default: inference.yml's)")
    p.add_argument("--trt-cache-dir", help="where TensorRT engines are cached on the serving host")
    p.add_argument("--int8-calibration-table", dest="calibration_table",
                   help="onnxruntime --precision int8: a TensorRT calibration table in --trt-cache-dir")
    p.add_argument("--network-runtime", choices=NETWORK_RUNTIMES, default=DEFAULTS["network_runtime"],
                   help="onnxruntime: the network step in Triton's ONNX Runtime backend (GPU), or onnxruntime on "
                        "CPU inside a Python-backend model, for a server without that backend (the nvidia-pytriton "
                        "wheel's)")
    p.add_argument("--force", action="store_true", help="replace models of the same name in --out")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    options = {k: getattr(args, k) for k in DEFAULTS}
    written = make_repository(args.model_dir, args.out, name=args.name, force=args.force, **options)
    print(f"wrote {', '.join(written)} in {args.out}; serve it with: python deploy/triton/serve.py "
          f"--repository {args.out}")
    return 0


if __name__ == "__main__":
    run(main)
