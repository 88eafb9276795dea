"""EfficientDet-D0 through ONNX (issue 19 item 3): the ONNX graph stops before NMS (paddle2onnx's
multiclass_nms3 conversion gives wrong shapes in onnxruntime), the deploy package runs NMS, and

* the export writes inference.onnx, onnxruntime reproduces the dynamic model's candidates and the
  deploy Pipeline gives the Paddle program's four outputs on both backends;
* one export at 128 px with pre_nms_top_k above TensorRT's TopK limit, its convolutions pruned 2:4, keeps
  the pattern in the ONNX weights (``tools/prune_asp.py --check``) and the TopK within the limit;
* the detector overfit on the paddlelabel fruit photos (the session's ``fruit_run``, whose category ids
  have gaps as COCO's do) passes ``--verify`` (AP parity with ppdlx's evaluator and per-image box
  agreement on paddle-cpu and onnxruntime), reports class names, a BGR ``inference.yml`` fails as
  pre-processing, and its export carries the BatchNorm statistics the evaluator re-estimates
  (``detection.precise_bn_batches``).
"""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import onnx
import paddle
import pytest
import yaml

from ppdlx.cpu_features import cpu_features, has_bf16

from benchmarks.infer import load_deploy_module
from ppdlx.config import load_config
from ppdlx.data.synthetic_coco import make_synthetic_coco
from ppdlx.export import export_model
from ppdlx.tasks import task_of

# the cases a failed --verify names: bf16, run on a CPU with bf16 hardware, is advisory (a warning line)
# OpenVINO reads the same ONNX file as onnxruntime, where it is installed
OPENVINO = importlib.util.find_spec("openvino") is not None
FP32_BACKENDS = {"paddle-cpu", "onnxruntime"} | ({"openvino"} if OPENVINO else set())
RAN = "paddle-cpu fp32, onnxruntime fp32" + (", openvino fp32" if OPENVINO else "")
BF16_RUNS = has_bf16(cpu_features())
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "demo", "efficientdet_demo.yaml")
D = load_deploy_module()


def _tool(*args, timeout=1800):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes")
    make_synthetic_coco(str(out))
    return out


def _detector(shapes, *overrides):
    cfg = load_config(CONFIG, [f"data.root={shapes}", "detection.freeze_bn_max_pixels=0", *overrides])
    paddle.seed(0)
    task = task_of(cfg)
    model = task.build_model(cfg, 3)
    model.eval()
    return cfg, model


def test_efficientdet_exports_to_onnx_and_runs_in_onnxruntime(random_detector_export):
    """The demo config's detector at 64 px (conftest ``random_detector_export``, shared with the Triton tests)."""
    cfg, model, model_dir = (random_detector_export[k] for k in ("cfg", "model", "dir"))
    report = random_detector_export["report"]
    assert report["checks"]["onnxruntime_bs2_max_abs_diff"] <= 1e-4
    meta = D.load_meta(str(model_dir))
    assert meta["model"]["onnx_file"] == "inference.onnx"
    assert meta["labels"] == ["circle", "square", "triangle"]  # COCO category names, in id order (1, 3, 7)
    assert [o["role"] for o in meta["onnx"]["outputs"]] == ["candidate_boxes", "candidate_scores", "candidate_classes"]
    assert meta["onnx"]["nms"] == {"type": "multiclass_nms3", "score_threshold": 0.001, "iou_threshold": 0.5,
                                   "keep_top_k": 100, "nms_top_k": -1, "normalized": True, "box_coords": "input",
                                   "clip_to_input_hw": [64, 64]}
    graph = onnx.load(str(model_dir / "inference.onnx")).graph
    weights = {t.name for t in graph.initializer}
    convs = [n for n in graph.node if n.op_type == "Conv"]
    assert convs and all(n.input[1] in weights for n in convs)  # initializers, not Constant nodes
    images = [D.load_image(p) for p in sorted((random_detector_export["shapes"] / "val").glob("*.jpg"))[:3]]
    session_outputs = D.OnnxPredictor(str(model_dir), threads=1).run(D.Preprocessor(meta).feeds(images))
    from ppdlx.models.detection.det_postprocess import EfficientDetPostProcess
    k = min(cfg.detection.pre_nms_top_k, EfficientDetPostProcess.from_model(model).num_anchors * 3)
    assert [list(o.shape) for o in session_outputs] == [[3, k, 4], [3, k], [3, k]]
    on_paddle = D.Pipeline.open(str(model_dir), "paddle-cpu", threads=1).run(images)
    on_onnx = D.Pipeline.open(str(model_dir), "onnxruntime", threads=1).run(images)
    assert [(o.shape, o.dtype) for o in on_onnx] == [(o.shape, o.dtype) for o in on_paddle]
    assert on_onnx[3].tolist() == on_paddle[3].tolist()  # as many kept boxes per image


@pytest.fixture(scope="module")
def tensorrt_export(shapes, tmp_path_factory):
    """What a TensorRT engine is built from: EfficientDet-D0 at 128 px (random weights, seed 0) with
    pre_nms_top_k=5000, above TensorRT's TopK limit, every convolution with a multiple of 4 input channels
    pruned 2:4 (the pattern its sparse kernels need), exported once with ONNX."""
    from ppdlx.sparsity.masks import compute_mask
    cfg, model = _detector(shapes, "data.coco.image_size=128", "detection.pre_nms_top_k=5000")
    pruned = 0
    for layer in model.sublayers():
        if isinstance(layer, paddle.nn.Conv2D) and layer._groups == 1 and layer.weight.shape[1] % 4 == 0:
            w = layer.weight.numpy()
            layer.weight.set_value(w * compute_mask(w, "conv2d"))
            pruned += 1
    assert pruned > 50
    out = tmp_path_factory.mktemp("det_tensorrt")
    report = export_model(cfg, output_dir=str(out), model=model, onnx=True, check_batch_sizes=(2,))
    return {"dir": out, "report": report, "pruned": pruned}


def test_pruned_efficientdet_keeps_2_4_in_the_onnx_weights(tensorrt_export):
    model_dir, pruned = tensorrt_export["dir"], tensorrt_export["pruned"]
    onnx_check = _tool(os.path.join("tools", "prune_asp.py"), "--check", str(model_dir / "inference.onnx"))
    assert onnx_check.returncode == 0, onnx_check.stdout[-2000:] + onnx_check.stderr[-2000:]
    program_check = _tool(os.path.join("tools", "prune_asp.py"), "--check", str(model_dir))
    assert program_check.returncode == 0, program_check.stderr[-2000:]
    checked = [line for line in onnx_check.stdout.splitlines() if line.endswith("0 violating")]
    assert checked and checked[0] == [line for line in program_check.stdout.splitlines()
                                      if line.endswith("violating")][0]
    assert int(checked[0].split()[0]) >= pruned


@pytest.fixture(scope="module")
def verified(fruit_run, tmp_path_factory):
    """The fruit overfit (100 steps on the 4 labelled photos, 2 classes at COCO ids 2 and 5, 128 px) exported
    with ONNX and ``--verify``, once for the tests that read a trained detector's export."""
    export = tmp_path_factory.mktemp("fruit_export")
    overrides = [f"data.root={fruit_run['data']}", f"model.weights={fruit_run['run'] / 'best'}"]
    proc = _tool(os.path.join("tools", "export_model.py"), "-c", fruit_run["config"], "-o", *overrides,
                 "--output-dir", str(export), "--onnx", "--verify")
    return {"proc": proc, "export": export, "config": fruit_run["config"], "overrides": overrides}


def _meta(model_dir):
    with open(os.path.join(model_dir, "inference.yml"), encoding="utf-8") as f:
        return yaml.safe_load(f)


def test_fruit_detector_passes_verify_on_paddle_and_onnxruntime(verified, fruit_run):
    proc, export = verified["proc"], verified["export"]
    record = _meta(export)["verify"]
    assert _meta(export)["labels"] == ["pear", "apple"]
    # class index -> category id goes through a lookup, not index + 1: ids with a gap, as COCO's
    assert json.loads((fruit_run["run"] / "classes.json").read_text())["category_ids"] == [2, 5]
    assert record["images"] == 4 and record["reference"]["AP50"] >= 0.8
    reference = record["reference"]
    ran = {(c["backend"], c["precision"]): c for c in record["cases"] if not c.get("skipped")}
    fp32 = {k: c for k, c in ran.items() if k[1] == "fp32"}
    assert set(fp32) == {(b, "fp32") for b in FP32_BACKENDS} and all(c["passed"] for c in fp32.values())
    for case in fp32.values():
        assert abs(case["AP"] - reference["AP"]) <= 0.005 and abs(case["AP50"] - reference["AP50"]) <= 0.005
        assert case["agreement"] == 1.0 and case["numerics_agreement"] >= 0.995
    assert abs(fp32[("onnxruntime", "fp32")]["AP"] - fp32[("paddle-cpu", "fp32")]["AP"]) <= 1e-4
    # bf16 (CPUs with bf16 hardware) is advisory: on 4 images one changed box can cost ~5 AP points, more
    # than the 1-point gate; the fp32 export still passes, and the miss is a warning naming bf16
    assert proc.returncode == 0 and record["passed"] is True, proc.stdout[-2000:] + proc.stderr[-3000:]
    bf16 = ran.get(("paddle-cpu", "bf16"))
    if bf16 is not None and not bf16["passed"]:
        assert "paddle-cpu bf16 (onednn)" in proc.stdout and "-> FAIL (advisory)" in proc.stdout
        assert record["warnings"][0].startswith("--verify: paddle-cpu bf16 is outside the gate (numerics: ")
        assert "warning: --verify: paddle-cpu bf16 is outside the gate" in proc.stdout
    else:
        assert record["warnings"] == []


def test_detection_outputs_name_the_classes(verified, fruit_run):
    coco = json.loads((fruit_run["data"] / "annotations" / "instances_all.json").read_text())
    image = coco["images"][0]
    name_of = {c["id"]: c["name"] for c in coco["categories"]}
    shown = {name_of[a["category_id"]] for a in coco["annotations"] if a["image_id"] == image["id"]}
    proc = _tool(os.path.join("deploy", "python", "infer.py"), "--model-dir", str(verified["export"]), "--input",
                 str(fruit_run["data"] / "images" / image["file_name"]), "--backend", "onnxruntime",
                 "--score-threshold", "0.0", "--threads", "1", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()[1:]
    assert lines and all(line.split()[0] in ("pear", "apple") for line in lines)
    assert shown and shown <= {line.split()[0] for line in lines}  # the overfit finds what the photo holds


def test_bgr_inference_yml_fails_as_pre_processing(verified, tmp_path):
    broken = tmp_path / "bgr"
    shutil.copytree(verified["export"], broken)
    meta = _meta(broken)
    meta["preprocess"]["color"] = "BGR"
    with open(broken / "inference.yml", "w", encoding="utf-8") as f:
        yaml.safe_dump(meta, f, sort_keys=False)
    proc = _tool(os.path.join("tools", "export_model.py"), "-c", verified["config"], "-o", *verified["overrides"],
                 "--output-dir", str(broken), "--verify-only", "--verify-images", "12")
    assert proc.returncode == 1, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: --verify failed ({RAN}): pre-processing: inference.yml preprocess "
        "differs from ppdlx's eval transform: color 'BGR' (ppdlx: 'RGB')"), proc.stderr[-2000:]
    assert np.isfinite(_meta(broken)["verify"]["deploy_inputs"]["max_abs_diff"])


def test_export_carries_the_batchnorm_statistics_the_evaluator_uses(fruit_run, tmp_path):
    """With ``detection.precise_bn_batches`` the evaluator re-estimates BatchNorm statistics before evaluating
    (the shapes demo recipe: 8 batches), and so does the export: from the raw weights (model.weights_copy=raw;
    the default copy, the EMA, keeps the statistics its last evaluation re-estimated), every weight is the
    checkpoint's, and of its statistics only those of the layers that keep fixed statistics
    (detection.freeze_bn_max_pixels) are; an export with precise_bn_batches=0 holds the checkpoint's running
    statistics, all of them. Here on the fruit overfit's checkpoint (its recipe keeps the running statistics),
    re-estimated from its one batch of 4 photos. (An earlier version asked that stale export to fail --verify,
    which depends on how far training moved the statistics: true for one trained model, not for another.)"""
    import hashlib
    weights = f"model.weights={fruit_run['run'] / 'best'}"
    overrides = [f"data.root={fruit_run['data']}", weights, "model.weights_copy=raw"]
    runs = {}
    for name, batches in (("fresh", 1), ("stale", 0)):
        runs[name] = _tool(os.path.join("tools", "export_model.py"), "-c", fruit_run["config"], "-o", *overrides,
                           f"detection.precise_bn_batches={batches}", "--output-dir", str(tmp_path / name))
        assert runs[name].returncode == 0, runs[name].stderr[-2000:]
    assert "BatchNorm statistics re-estimated from 1 training batches" in runs["fresh"].stdout + runs["fresh"].stderr

    def digest(tensor):
        return hashlib.sha1(np.ascontiguousarray(tensor.numpy()).tobytes()).hexdigest()

    def exported(model_dir):
        return {digest(v) for v in paddle.jit.load(os.path.join(str(model_dir), "inference")).state_dict().values()}

    checkpoint = paddle.load(os.path.join(weights.split("=", 1)[1], "model.pdparams"))
    statistics = [digest(v) for k, v in checkpoint.items() if k.endswith(("._mean", "._variance"))]
    others = [digest(v) for k, v in checkpoint.items() if not k.endswith(("._mean", "._variance"))]
    frozen = int(re.search(r"detection.freeze_bn_max_pixels=\d+: (\d+) BatchNorm layers",
                           runs["fresh"].stdout + runs["fresh"].stderr).group(1))
    good, old = exported(tmp_path / "fresh"), exported(tmp_path / "stale")
    assert len(statistics) == 216 and 0 < frozen < 108
    assert all(d in good and d in old for d in others)
    assert all(d in old for d in statistics)
    assert sum(d in good for d in statistics) == 2 * frozen


def _topk_ks(graph):
    initializers = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    ks = []
    for node in (n for n in graph.node if n.op_type == "TopK"):
        name = node.input[1]
        while name in producers and producers[name].op_type in ("Cast", "Identity"):
            name = producers[name].input[0]
        ks.append(int(initializers[name].reshape(-1)[0]))
    return ks


def test_the_onnx_detector_is_within_tensorrt_topk_limit_and_divides_its_anchor_indices_as_integers(
        tensorrt_export):
    """TensorRT builds no TopK with k > 3840, and an engine built with --fp16 may run float Div layers
    in float16 (exact to 2048): the anchor index of each candidate (up to 9207 here) is an integer Div."""
    model_dir = tensorrt_export["dir"]
    assert tensorrt_export["report"]["checks"]["onnxruntime_bs2_max_abs_diff"] <= 1e-4
    graph = onnx.load(str(model_dir / "inference.onnx")).graph
    assert _topk_ks(graph) == [3840]
    assert D.load_meta(str(model_dir))["postprocess"]["pre_nms_top_k"] == 3840
    indices = [next(n for n in graph.node if n.op_type == "TopK").output[1]]
    indices += [n.output[0] for n in graph.node if n.op_type == "Identity" and n.input[0] in indices]
    readers = [n for n in graph.node if set(indices) & set(n.input) and n.op_type != "Identity"]
    assert sorted(n.op_type for n in readers) == ["Div", "Mod"]
    assert not any(n.op_type == "Floor" for n in graph.node)
