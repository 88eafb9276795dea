"""Export specs (``ppdlx/export/families.py``): a task describes its export as plain data, and a
detector exports from that description alone; the model-sniffing fallback lives in one function."""
import ast
import os

import numpy as np
import paddle
import pytest

from ppdlx.config import load_config
from ppdlx.errors import ConfigError
from ppdlx.export import (classification_export_spec, detection_export_spec, export_model, find_model_files,
                          read_meta)
from ppdlx.export.families import export_graph
from ppdlx.export.paddle_export import DetectorForExport, PaddleInferenceRunner, random_feeds, run_dynamic
from ppdlx.models.from_config import build_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPORT_DIR = os.path.join(ROOT, "ppdlx", "export")
TOL = 1e-4
# EfficientDet-D0's anchor settings written out, as a task plug-in would supply them
D0_ANCHORS = {"min_level": 3, "max_level": 7, "num_scales": 3,
              "aspect_ratios": ((1.0, 1.0), (1.4, 0.7), (0.7, 1.4)), "anchor_scale": 4.0}


def _cfg(*overrides):
    from ppdlx.tasks.preprocess import resolve_preprocessing  # the nulls: the model's default_cfg
    return resolve_preprocessing(load_config(None, [
        "model.num_classes=3", "data.transforms.crop_size=64", "data.transforms.resize_short=72",
        "data.root=/nonexistent", "global.seed=3", *overrides]))


class SpecOnlyDetector(paddle.nn.Layer):
    """EfficientDet without the attributes the legacy probe looks for: only the spec says it is a detector."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.num_classes, self.data_format = inner.num_classes, inner.data_format

    def forward(self, image):
        return self.inner(image)


def test_classification_spec_is_plain_data():
    t = _cfg().data.transforms
    spec = classification_export_spec(t, "probabilities", 3)
    assert spec == {"family": "classification", "image_size": 64, "output": "probabilities",
                    "preprocess": {"type": "resize_short_center_crop", "resize_short": 72, "crop_size": 64,
                                   "interpolation": "bilinear", "mean": [123.675, 116.28, 103.53],
                                   "std": [58.395, 57.12, 57.375], "color": "RGB"},
                    "postprocess": {"type": "topk", "output": "probabilities", "topk": 3},
                    "trt_batches": {"opt_batch": 32, "max_batch": 256}}


def test_detector_exports_from_a_plain_spec(tmp_path):
    cfg = _cfg("model.name=efficientdet_d0", "model.args={image_size: 128}")
    paddle.seed(0)
    inner = build_model(cfg)
    inner.eval()
    assert dict(inner.anchor_args) == D0_ANCHORS  # the literal above is the model's own setting
    model = SpecOnlyDetector(inner)
    spec = detection_export_spec(cfg.data.transforms, 128, 3, D0_ANCHORS, nms={"max_detections": 20})
    report = export_model(cfg, output_dir=str(tmp_path), model=model, export_spec=spec, check_batch_sizes=(2,),
                          atol=TOL, rtol=0.0)
    assert report["family"] == "detection" and report["checks"]["paddle_inference_bs2_max_abs_diff"] <= TOL
    meta = read_meta(str(tmp_path))
    assert [i["name"] for i in meta["inputs"]] == ["image", "image_scale"]
    assert meta["inputs"][0]["shape"] == [-1, 3, 128, 128]
    assert [o["role"] for o in meta["outputs"]] == ["boxes", "scores", "classes", "count"]
    assert meta["preprocess"] == {"type": "resize_long_pad", "size": 128, "interpolation": "bilinear",
                                  "mean": [123.675, 116.28, 103.53], "std": [58.395, 57.12, 57.375],
                                  "pad_value": 0.0, "color": "RGB"}
    assert meta["postprocess"] == {"type": "detections", "box_format": "xyxy", "coords": "original",
                                   "score_threshold": 0.4, "max_detections": 20, "nms_iou_threshold": 0.5,
                                   "pre_nms_top_k": 3840, "nms_score_threshold": 0.001}  # TensorRT's TopK limit
    assert meta["tensorrt"]["shape_range"]["image"]["opt"] == [8, 3, 128, 128]
    # the program is the model followed by post-processing built from the spec's anchors and NMS settings
    from ppdlx.models.detection.det_postprocess import EfficientDetPostProcess
    reference_post = EfficientDetPostProcess.from_model(inner, max_detections=20, pre_nms_top_k=3840)
    feeds = random_feeds(meta["inputs"], 1, seed=5)
    expected = run_dynamic(DetectorForExport(inner, reference_post), meta["inputs"], feeds)
    got = PaddleInferenceRunner(find_model_files(str(tmp_path))).run(feeds)
    assert got[0].shape == (1, 20, 4)
    for g, e in zip(got, expected):
        assert float(np.abs(g.astype("float64") - e).max()) <= TOL
    # Paddle-TRT keeps NMS out of TensorRT; the ops after it must not form an engine of their own (its
    # input is NMS's variable-length output), the detector before it must
    ops = _program_ops(str(tmp_path / "inference"))
    nms = ops.index("pd_op.multiclass_nms3")
    after = [op for op in ops[nms + 1:] if op not in ("pd_op.fetch", "pd_op.data")]
    assert len(after) <= meta["tensorrt"]["min_subgraph_size"] == 200 < nms


def _program_ops(prefix: str) -> list:
    paddle.enable_static()
    try:
        with paddle.pir_utils.IrGuard():
            program, _, _ = paddle.static.load_inference_model(prefix, paddle.static.Executor(paddle.CPUPlace()))
        return [op.name() for op in program.global_block().ops]
    finally:
        paddle.disable_static()


def test_unknown_family_is_one_line(tmp_path):
    spec = {**classification_export_spec(_cfg().data.transforms, "logits", 3), "family": "segmentation"}
    with pytest.raises(ConfigError) as err:
        export_graph(paddle.nn.Linear(2, 2), spec, str(tmp_path), "NCHW", "pir")
    assert str(err.value) == "export spec family='segmentation': expected one of classification, detection"
    assert not os.listdir(tmp_path)


def _probes(tree):
    """(line, what) of every "is this a detector?" probe under an AST node: the detector attribute
    ``anchor_args`` (read or named in ``hasattr``) and a model name starting with ``efficientdet``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "anchor_args":
            found.add((node.lineno, "attribute anchor_args"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                (node.value == "anchor_args" or node.value.startswith("efficientdet")):
            found.add((node.lineno, f"string {node.value!r}"))
    return found


def test_export_has_no_detector_probe_the_task_plugin_supplies_the_spec():
    outside = []
    for name in sorted(os.listdir(EXPORT_DIR)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(EXPORT_DIR, name), encoding="utf-8") as f:
            outside += [f"ppdlx/export/{name}:{line}: {what}" for line, what in sorted(_probes(ast.parse(f.read())))]
    assert not outside, "detector probes in export (the task plug-in's export_spec says what a model is):\n" + \
        "\n".join(outside)
