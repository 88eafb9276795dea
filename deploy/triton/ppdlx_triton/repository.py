"""A Triton model repository from a ppdlx export directory (``make_repo.py`` is its command line).

``--backend python`` (CPU, or Paddle-TRT / CUDA on a GPU): one Python-backend model that runs the
export through ``ppdlx_deploy.Pipeline``::

    REPO/NAME/config.pbtxt, labels.txt
    REPO/NAME/1/model.py, ppdlx_triton/, ppdlx_deploy/, export/ (the program, weights, inference.yml)

``--backend onnxruntime`` (GPU, NVIDIA's server image): the ONNX export under Triton's ONNX Runtime
backend with its TensorRT execution provider, between two Python steps, as one ensemble that clients
call by the same name with the same tensors::

    REPO/NAME_preprocess/   image files -> the network's input (+ scale and size of each image)
    REPO/NAME_network/      1/model.onnx, onnxruntime + TensorRT fp32/fp16/int8, dynamic batching
                            (``--network-runtime python``: onnxruntime on CPU in a Python-backend model)
    REPO/NAME_postprocess/  NMS (detector), clipping, top-k -> the served outputs
    REPO/NAME/              the ensemble of the three
"""
from __future__ import annotations

import os
import re
import shutil
from typing import Dict, List, Optional, Sequence

import ppdlx_deploy
from ppdlx_deploy import load_meta, model_files
from ppdlx_deploy.errors import DeployError
from ppdlx_deploy.postprocess import decodes_boxes

from . import config as C
from .serving import IMAGE_INPUT, IMAGE_SIZE, onnx_outputs, pack_labels, result_names

BACKENDS = ("python", "onnxruntime")
PREDICTOR_BACKENDS = ("auto", "paddle-cpu", "onnxruntime", "openvino", "paddle-gpu", "trt")
GPU_PREDICTORS = ("paddle-gpu", "trt")
# these read the export's ONNX file (openvino reads a legacy program too; auto may choose either runtime)
ONNX_READERS = ("auto", "onnxruntime", "openvino")
# The ONNX route's network step: Triton's ONNX Runtime backend (GPU, TensorRT), or onnxruntime inside a
# Python-backend model on CPU, for a server without that backend (the nvidia-pytriton wheel's).
NETWORK_RUNTIMES = ("triton", "python")
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
DEPLOY_PACKAGE_DIR = os.path.dirname(os.path.abspath(ppdlx_deploy.__file__))
LABELS_FILE = "labels.txt"


def default_name(meta: dict) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(meta["model"].get("name") or "model"))


def image_input(meta: dict, section: Optional[dict] = None) -> dict:
    inputs = (section or meta)["inputs"]
    return next(i for i in inputs if i.get("role", "image") == "image")


def result_tensors(meta: dict, topk: int) -> List[C.Tensor]:
    """The served outputs (``ppdlx_triton.serving``'s interface) with their dims."""
    if not decodes_boxes(meta):
        classes = int(meta["model"]["num_classes"])
        k = min(topk, classes)
        return [C.Tensor("class_ids", "int64", [k]), C.Tensor("scores", "float32", [k]),
                C.Tensor("probabilities", "float32", [classes], label_filename=LABELS_FILE)]
    return [C.Tensor("boxes", "float32", [-1, 4]), C.Tensor("scores", "float32", [-1]),
            C.Tensor("class_ids", "int64", [-1]), C.Tensor("count", "int32", [1])]


def network_tensors(meta: dict) -> tuple:
    """The ONNX graph's input and outputs as Triton tensors (dims after the batch dimension): names and
    shapes from ``inference.yml``; a detector's candidates are ``[K, 4]`` / ``[K]`` / ``[K]`` (K = the
    ``pre_nms_top_k`` the export kept, written -1), classes int64 as paddle2onnx writes top-k indices."""
    image = image_input(meta, meta.get("onnx"))
    inputs = [C.Tensor(image["name"], image.get("dtype", "float32"), image["shape"][1:])]
    outputs = []
    for out in onnx_outputs(meta):
        role = out["role"]
        if role in ("logits", "probabilities"):
            outputs.append(C.Tensor(out["name"], "float32", [int(meta["model"]["num_classes"])]))
        elif role == "candidate_boxes":
            outputs.append(C.Tensor(out["name"], "float32", [-1, 4]))
        elif role == "candidate_scores":
            outputs.append(C.Tensor(out["name"], "float32", [-1]))
        elif role == "candidate_classes":
            outputs.append(C.Tensor(out["name"], "int64", [-1]))
        else:
            raise DeployError(f"inference.yml: ONNX output {out['name']} has role {role!r}, which the ONNX route "
                              f"does not serve; re-export with tools/export_model.py --onnx")
    return inputs, outputs


def _step_parameters(role: str, options: dict, meta: dict) -> Dict[str, str]:
    parameters = {"role": role, "topk": str(options["topk"]), "labels": pack_labels(meta)}
    if options.get("score_threshold") is not None:
        parameters["score_threshold"] = str(options["score_threshold"])
    return parameters


def _copy_code(version_dir: str, export_files: Sequence[str]) -> None:
    """model.py with the two packages it imports and the export files, into ``version_dir``."""
    os.makedirs(version_dir)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copy2(os.path.join(PACKAGE_DIR, "model.py"), os.path.join(version_dir, "model.py"))
    shutil.copytree(PACKAGE_DIR, os.path.join(version_dir, "ppdlx_triton"), ignore=ignore)
    shutil.copytree(DEPLOY_PACKAGE_DIR, os.path.join(version_dir, "ppdlx_deploy"), ignore=ignore)
    export_dir = os.path.join(version_dir, "export")
    os.makedirs(export_dir)
    for path in export_files:
        shutil.copy2(path, export_dir)


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _write_labels(model_dir: str, meta: dict) -> None:
    labels = meta.get("labels") or [str(i) for i in range(int(meta["model"]["num_classes"]))]
    _write(os.path.join(model_dir, LABELS_FILE), "".join(str(x).replace("\n", " ") + "\n" for x in labels))


def check_options(meta: dict, options: dict) -> None:
    """Values a server would only reject at load or run time, refused now in one line."""
    for key in ("max_batch_size", "instances", "topk"):
        if int(options[key]) < 1:
            raise DeployError(f"--{key.replace('_', '-')} {options[key]}: must be 1 or more")
    if options["queue_delay_us"] < 0:
        raise DeployError(f"--queue-delay-us {options['queue_delay_us']}: must be 0 or more")
    if options["network_runtime"] not in NETWORK_RUNTIMES:
        raise DeployError(f"--network-runtime {options['network_runtime']}: choose {' or '.join(NETWORK_RUNTIMES)}")
    if options["backend"] not in BACKENDS:
        raise DeployError(f"--backend {options['backend']}: choose {' or '.join(BACKENDS)}")
    if options["predictor_backend"] not in PREDICTOR_BACKENDS:
        raise DeployError(f"--predictor-backend {options['predictor_backend']}: choose from "
                          f"{', '.join(PREDICTOR_BACKENDS)}")
    trt_max = int((meta.get("tensorrt") or {}).get("max_batch_size") or 0)
    if options["backend"] == "python" and options["predictor_backend"] == "trt" and trt_max \
            and options["max_batch_size"] > trt_max:
        raise DeployError(f"--max-batch-size {options['max_batch_size']}: above the export's TensorRT shape range "
                          f"(inference.yml tensorrt.max_batch_size {trt_max}); re-export or lower it")


def python_model(out: str, name: str, model_dir: str, meta: dict, options: dict) -> List[str]:
    files = model_files(model_dir, meta)
    gpu = options["predictor_backend"] in GPU_PREDICTORS
    parameters = {**_step_parameters("pipeline", options, meta), "backend": options["predictor_backend"],
                  "precision": options["precision"], "instance_count": str(options["instances"])}
    if options.get("threads"):
        parameters["threads"] = str(options["threads"])
    if options.get("trt_cache_dir"):
        parameters["trt_cache_dir"] = options["trt_cache_dir"]
    text = C.model_config(
        name, backend="python", max_batch_size=options["max_batch_size"],
        inputs=[C.Tensor(IMAGE_INPUT, "uint8", [-1], ragged=True)], outputs=result_tensors(meta, options["topk"]),
        instances=("KIND_GPU" if gpu else "KIND_CPU", options["instances"]),
        dynamic_batching=C.batching(options["max_batch_size"], options["preferred_batch_sizes"],
                                    options["queue_delay_us"]),
        parameters=parameters)
    model_root = os.path.join(out, name)
    export_files = [files["model_file"], files["params_file"], os.path.join(model_dir, "inference.yml")]
    onnx_file = os.path.join(model_dir, meta["model"].get("onnx_file") or "inference.onnx")
    if options["predictor_backend"] in ONNX_READERS and os.path.isfile(onnx_file):
        export_files.append(onnx_file)
    _copy_code(os.path.join(model_root, "1"), export_files)
    _write(os.path.join(model_root, "config.pbtxt"), text)
    _write_labels(model_root, meta)
    return [name]


def onnx_ensemble(out: str, name: str, model_dir: str, meta: dict, options: dict) -> List[str]:
    onnx_file = os.path.join(model_dir, meta["model"].get("onnx_file") or "inference.onnx")
    if not os.path.isfile(onnx_file):
        raise DeployError(f"{onnx_file}: not found; --backend onnxruntime serves the ONNX export "
                          f"(tools/export_model.py --onnx)")
    batch = options["max_batch_size"]
    net_inputs, net_outputs = network_tensors(meta)
    image = net_inputs[0]
    scale, size = C.Tensor("image_scale", "float32", [1]), C.Tensor(IMAGE_SIZE, "int32", [2])
    files_in = C.Tensor(IMAGE_INPUT, "uint8", [-1], ragged=True)
    results = result_tensors(meta, options["topk"])
    dynamic = C.batching(batch, options["preferred_batch_sizes"], options["queue_delay_us"])
    cpu_steps = ("KIND_CPU", options["instances"])
    pre, net, post = f"{name}_preprocess", f"{name}_network", f"{name}_postprocess"
    meta_file = os.path.join(model_dir, "inference.yml")

    shape = "x".join(str(d) for d in image.dims)
    profile = {k: f"{image.name}:{b}x{shape}" for k, b in
               (("min", 1), ("opt", max(options["preferred_batch_sizes"] or [batch])), ("max", batch))}
    accelerator = None if options["network_runtime"] == "python" else C.tensorrt_accelerator(
        options["precision"], (meta.get("tensorrt") or {}).get("workspace_size_bytes", 1 << 30),
        options.get("trt_cache_dir") or f"/tmp/ppdlx_trt_cache/{name}", profile, options.get("calibration_table"))

    _copy_code(os.path.join(out, pre, "1"), [meta_file])
    _write(os.path.join(out, pre, "config.pbtxt"), C.model_config(
        pre, backend="python", max_batch_size=batch, inputs=[files_in], outputs=[image, scale, size],
        instances=cpu_steps, dynamic_batching=dynamic, parameters=_step_parameters("preprocess", options, meta)))

    if options["network_runtime"] == "python":  # onnxruntime inside a Python-backend model, on CPU
        _copy_code(os.path.join(out, net, "1"), [meta_file, onnx_file])
        network = C.model_config(
            net, backend="python", max_batch_size=batch, inputs=net_inputs, outputs=net_outputs,
            instances=cpu_steps, dynamic_batching=dynamic,
            parameters={"role": "network", **({"threads": str(options["threads"])} if options["threads"] else {}),
                        "instance_count": str(options["instances"])})
    else:
        os.makedirs(os.path.join(out, net, "1"))
        shutil.copy2(onnx_file, os.path.join(out, net, "1", "model.onnx"))
        network = C.model_config(
            net, backend="onnxruntime", max_batch_size=batch, inputs=net_inputs, outputs=net_outputs,
            instances=("KIND_GPU", options["instances"]), dynamic_batching=dynamic, extra=[accelerator])
    _write(os.path.join(out, net, "config.pbtxt"), network)

    _copy_code(os.path.join(out, post, "1"), [meta_file])
    _write_labels(os.path.join(out, post), meta)  # its probabilities output names the classes too
    _write(os.path.join(out, post, "config.pbtxt"), C.model_config(
        post, backend="python", max_batch_size=batch, inputs=[*net_outputs, scale, size], outputs=results,
        instances=cpu_steps, dynamic_batching=dynamic, parameters=_step_parameters("postprocess", options, meta)))

    os.makedirs(os.path.join(out, name, "1"))
    passthrough = {scale.name: scale.name, size.name: size.name}
    steps = [(pre, {IMAGE_INPUT: IMAGE_INPUT}, {image.name: image.name, **passthrough}),
             (net, {image.name: image.name}, {t.name: t.name for t in net_outputs}),
             (post, {**{t.name: t.name for t in net_outputs}, **passthrough}, {n: n for n in result_names(meta)})]
    _write(os.path.join(out, name, "config.pbtxt"), C.ensemble_config(
        name, inputs=[files_in], outputs=results, max_batch_size=batch, steps=steps,
        parameters={"labels": pack_labels(meta)}))
    _write_labels(os.path.join(out, name), meta)
    return [pre, net, post, name]


DEFAULTS = {"backend": "python", "max_batch_size": 8, "instances": 1, "preferred_batch_sizes": None,
            "queue_delay_us": 2000, "predictor_backend": "paddle-cpu", "precision": "fp32", "threads": None,
            "topk": 5, "score_threshold": None, "trt_cache_dir": None, "calibration_table": None,
            "network_runtime": "triton"}


def make_repository(model_dir: str, out: str, name: Optional[str] = None, force: bool = False,
                    **given) -> List[str]:
    """Write the models of ``out`` for the export in ``model_dir`` (options: :data:`DEFAULTS`); returns
    the model directories written. An existing model of the same name is replaced only with ``force``."""
    unknown = set(given) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"make_repository: unknown options {sorted(unknown)}")
    options = {**DEFAULTS, **{k: v for k, v in given.items() if v is not None}}
    options["preferred_batch_sizes"] = list(options["preferred_batch_sizes"] or [options["max_batch_size"]])
    meta = load_meta(model_dir)
    check_options(meta, options)
    name = name or default_name(meta)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise DeployError(f"--name {name}: use letters, digits, '_', '.' or '-' (it is a directory and a URL part)")
    planned = [name] if options["backend"] == "python" else [f"{name}_{s}" for s in
                                                               ("preprocess", "network", "postprocess")] + [name]
    existing = [p for p in planned if os.path.exists(os.path.join(out, p))]
    if existing and not force:
        raise DeployError(f"{os.path.join(out, existing[0])} exists; pass --force to replace it")
    for p in existing:
        shutil.rmtree(os.path.join(out, p))
    os.makedirs(out, exist_ok=True)
    build = python_model if options["backend"] == "python" else onnx_ensemble
    return build(out, name, model_dir, meta, options)
