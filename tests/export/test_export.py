"""Export: Paddle Inference (CPU, oneDNN) and onnxruntime reproduce the dynamic model (max abs diff
<= 1e-4 at two batch sizes) for ResNet50 and GPUNet, inference.yml carries what a predictor
needs, both Paddle 3 program formats are detected from the files, and the CLI writes it all."""
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest
from PIL import Image

from benchmarks.infer import load_deploy_module
from ppdlx.config import load_config
from ppdlx.errors import ConfigError, UnsupportedError
from ppdlx.export import export_model, find_model_files, read_meta, save_classifier
from ppdlx.export.onnx_export import ExportCheckError
from ppdlx.export.paddle_export import ClassifierForExport, PaddleInferenceRunner, random_feeds, run_dynamic
from ppdlx.models.from_config import build_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = 1e-4
BATCHES = (1, 3)


def small_cfg(name, **extra):
    overrides = [f"model.name={name}", "model.num_classes=5", "data.transforms.crop_size=64",
                 "data.transforms.resize_short=72", "data.root=/nonexistent", "global.seed=3"]
    overrides += [f"{k}={v}" for k, v in extra.items()]
    return load_config(None, overrides)


def small_model(cfg):
    """The configured model at initialisation with its classifier rescaled so logits are O(1):
    an untrained BN stack gives logits in the 100s, where 1e-4 absolute would be a 1e-6
    relative bar; at O(1) the same 1e-4 is a fair fp32 bar for a 50-layer network."""
    paddle.seed(cfg.global_cfg.seed)
    model = build_model(cfg)
    model.eval()
    shape = [2, 3, 64, 64] if cfg.model.data_format == "NCHW" else [2, 64, 64, 3]
    with paddle.no_grad():
        probe = model(paddle.to_tensor(np.random.default_rng(0).standard_normal(shape).astype("float32")))
        factor = 2.0 / float(paddle.abs(probe).max())
        fc = [m for m in model.sublayers() if isinstance(m, paddle.nn.Linear)][-1]
        fc.weight.set_value(fc.weight * factor)
        fc.bias.set_value(fc.bias * factor)
    return model


@pytest.fixture(scope="module")
def rn50_export(tmp_path_factory):
    cfg = small_cfg("resnet50")
    model = small_model(cfg)
    out = str(tmp_path_factory.mktemp("rn50"))
    report = export_model(cfg, output_dir=out, model=model, onnx=True, labels=list("abcde"),
                          check_batch_sizes=BATCHES, atol=TOL, rtol=0.0)
    return cfg, model, report


def test_resnet50_paddle_inference_and_onnx_match_dynamic(rn50_export):
    cfg, model, report = rn50_export
    checks = report["checks"]
    for bs in BATCHES:  # measured by export_model: CPU oneDNN predictor and onnxruntime vs dynamic
        assert checks[f"paddle_inference_bs{bs}_max_abs_diff"] <= TOL
        assert checks[f"onnxruntime_bs{bs}_max_abs_diff"] <= TOL
    # and through the deploy predictors (tuned executor, threads), on fresh inputs
    D = load_deploy_module()
    meta = D.load_meta(report["model_dir"])
    paddle_pred = D.PaddlePredictor(report["model_dir"], "paddle-cpu", "fp32", threads=1, meta=meta)
    onnx_pred = D.OnnxPredictor(report["model_dir"], threads=1, meta=meta)
    layer = ClassifierForExport(model, "logits")
    for bs in BATCHES[-1:]:
        feeds = random_feeds(meta["inputs"], bs, seed=11)
        (ref,) = run_dynamic(layer, meta["inputs"], feeds)
        assert ref.shape == (bs, 5) and np.abs(ref).max() > 0.1  # real logits, not argmax
        assert float(np.abs(paddle_pred.run(feeds)[0] - ref).max()) <= TOL
        assert float(np.abs(onnx_pred.run(feeds)[0] - ref).max()) <= TOL


def test_inference_yml_has_what_a_predictor_needs(rn50_export):
    cfg, _, report = rn50_export
    meta = read_meta(report["model_dir"])
    m = meta["model"]
    assert (m["family"], m["name"], m["num_classes"], m["data_format"]) == ("classification", "resnet50", 5, "NCHW")
    assert m["format"] == "pir" and m["model_file"] == "inference.json" and m["onnx_file"] == "inference.onnx"
    assert meta["inputs"] == [{"name": "image", "shape": [-1, 3, 64, 64], "dtype": "float32", "layout": "NCHW",
                               "role": "image"}]
    assert [o["role"] for o in meta["outputs"]] == ["logits"]
    pre = meta["preprocess"]
    assert (pre["type"], pre["resize_short"], pre["crop_size"], pre["interpolation"]) == \
        ("resize_short_center_crop", 72, 64, "bilinear")
    assert pre["mean"] == [123.675, 116.28, 103.53] and pre["std"] == [58.395, 57.12, 57.375]
    assert meta["labels"] == list("abcde")
    trt = meta["tensorrt"]
    assert trt["workspace_size_bytes"] == 1 << 30 and trt["min_subgraph_size"] == 3
    assert trt["shape_range"]["image"] == {"min": [1, 3, 64, 64], "opt": [32, 3, 64, 64], "max": [256, 3, 64, 64]}


def test_gpunet_export_matches_dynamic(tmp_path):
    cfg = small_cfg("gpunet_0")
    model = small_model(cfg)
    report = export_model(cfg, output_dir=str(tmp_path), model=model, onnx=True, check_batch_sizes=BATCHES,
                          atol=TOL, rtol=0.0)
    assert report["inputs"][0]["shape"] == [-1, 3, 64, 64]
    for bs in BATCHES:
        assert report["checks"][f"paddle_inference_bs{bs}_max_abs_diff"] <= TOL
        assert report["checks"][f"onnxruntime_bs{bs}_max_abs_diff"] <= TOL


def test_nhwc_export_paddle_inference_and_onnx_refusal(tmp_path):
    cfg = small_cfg("resnet18_bottleneck_tiny", **{"model.data_format": "NHWC", "export.data_format": "NHWC"})
    model = small_model(cfg)
    report = export_model(cfg, output_dir=str(tmp_path), model=model, check_batch_sizes=BATCHES, atol=TOL, rtol=0.0)
    assert report["inputs"][0]["shape"] == [-1, 64, 64, 3] and report["inputs"][0]["layout"] == "NHWC"
    assert read_meta(str(tmp_path))["model"]["data_format"] == "NHWC"
    assert max(report["checks"].values()) <= TOL
    with pytest.raises(UnsupportedError, match="export.data_format at NCHW"):  # paddle2onnx would abort the process
        export_model(cfg, output_dir=str(tmp_path / "x"), model=model, onnx=True)


def test_a_model_trained_in_nhwc_is_exported_in_nchw_with_the_same_predictions(tmp_path):
    # what configs/rn50_amp.yaml trains in; ONNX and paddle.tensorrt take NCHW graphs only
    cfg = small_cfg("resnet18_bottleneck_tiny", **{"model.data_format": "NHWC"})
    model = small_model(cfg)
    report = export_model(cfg, output_dir=str(tmp_path), model=model, onnx=True, check_batch_sizes=(1,), atol=TOL,
                          rtol=0.0)
    assert report["inputs"][0]["shape"] == [-1, 3, 64, 64] and report["inputs"][0]["layout"] == "NCHW"
    assert read_meta(str(tmp_path))["model"]["data_format"] == "NCHW"
    images = np.random.default_rng(1).standard_normal((3, 3, 64, 64)).astype("float32")
    with paddle.no_grad():
        trained = model(paddle.to_tensor(images.transpose(0, 2, 3, 1))).numpy()
    files = find_model_files(str(tmp_path))
    from ppdlx.export.paddle_export import PaddleInferenceRunner
    exported = PaddleInferenceRunner(files).run({"image": images})[0]
    assert float(np.max(np.abs(exported - trained))) <= TOL
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(report["onnx_file"], providers=["CPUExecutionProvider"])
    assert float(np.max(np.abs(session.run(None, {"image": images})[0] - trained))) <= TOL


class BiasedNHWC(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.num_classes, self.data_format = 4, "NHWC"
        self.conv = paddle.nn.Conv2D(3, 4, 3, padding=1, data_format="NHWC")
        self.pool = paddle.nn.AdaptiveAvgPool2D(1, data_format="NHWC")

    def forward(self, x):
        return self.pool(self.conv(x)).flatten(1)


def test_a_program_paddle_inference_cannot_run_is_one_line(tmp_path):
    """Paddle 3.3's CPU predictor fails on a legacy program's NHWC convolution with a bias (a
    broadcast of the NCHW conv output with an NHWC bias; GPUNet fails in both formats); the export
    check says so in one line with the fix."""
    cfg = small_cfg("resnet18_bottleneck_tiny", **{"export.data_format": "NHWC"})
    with pytest.raises(UnsupportedError) as err:
        export_model(cfg, output_dir=str(tmp_path), model=BiasedNHWC(), check_batch_sizes=(1,), fmt="program")
    message = str(err.value)
    assert message.startswith("export check: Paddle Inference (CPU, oneDNN) cannot run the exported inference.pdmodel: ")
    assert "Broadcast dimension mismatch" in message and message.endswith("leave export.data_format at NCHW")
    assert "\n" not in message
    # the same layer exported in NCHW (the default layout) runs
    report = export_model(small_cfg("resnet18_bottleneck_tiny"), output_dir=str(tmp_path / "nchw"),
                          model=_relaid(BiasedNHWC()), check_batch_sizes=(1,), atol=TOL, rtol=0.0, fmt="program")
    assert max(report["checks"].values()) <= TOL


def _relaid(layer):
    """The layer's weights in the NCHW twin of it."""
    twin = BiasedNHWC()
    twin.data_format = "NCHW"
    twin.conv = paddle.nn.Conv2D(3, 4, 3, padding=1)
    twin.pool = paddle.nn.AdaptiveAvgPool2D(1)
    twin.set_state_dict(layer.state_dict())
    return twin


class Tiny(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.num_classes, self.data_format = 4, "NCHW"
        self.conv = paddle.nn.Conv2D(3, 4, 3, padding=1)
        self.pool = paddle.nn.AdaptiveAvgPool2D(1)

    def forward(self, x):
        return self.pool(self.conv(x)).flatten(1) * 3.0


class Noisy(Tiny):
    """Adds fresh random numbers: the program and the dynamic model never agree, so the export check fails
    after the program is written."""
    def forward(self, x):
        return super().forward(x) + paddle.rand([x.shape[0], 4])


def _file_bytes(folder):
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


@pytest.mark.parametrize("fmt", ["pir", "program"])
def test_a_failed_re_export_leaves_the_previous_export_whole(tmp_path, fmt):
    """The export is written and checked in a staging folder and published whole: a re-export whose check
    fails changes nothing in the folder (before: the old inference.yml stayed over the new program, and deploy
    called the export damaged); a good one replaces it, and the report names the published files."""
    cfg = small_cfg("resnet18_bottleneck_tiny")
    out = str(tmp_path / "export")
    paddle.seed(0)
    export_model(cfg, output_dir=out, model=Tiny(), check_batch_sizes=(1,), fmt=fmt)
    before = _file_bytes(out)
    with pytest.raises(ExportCheckError, match=r"max abs diff .* exceeds the tolerance"):
        export_model(cfg, output_dir=out, model=Noisy(), check_batch_sizes=(1,), fmt=fmt)
    assert _file_bytes(out) == before
    D = load_deploy_module()
    meta = D.load_meta(out)
    D.Pipeline.open(out, "paddle-cpu", "fp32", meta=meta)  # the integrity check of every recorded file passes
    paddle.seed(1)
    report = export_model(cfg, output_dir=out, model=Tiny(), check_batch_sizes=(1,), fmt=fmt)
    after = _file_bytes(out)
    assert sorted(after) == sorted(before) and after != before
    for key in ("model_file", "params_file", "meta_file"):
        assert os.path.dirname(report[key]) == os.path.abspath(out) and os.path.isfile(report[key]), key


def test_no_check_skips_the_onnx_check_as_well(tmp_path):
    """``check=False`` (``--no-check``) skips every check on random inputs (before: the onnxruntime one still ran
    and could refuse the export). A negative tolerance fails any check that runs."""
    cfg = small_cfg("resnet18_bottleneck_tiny")
    paddle.seed(0)
    with pytest.raises(ExportCheckError, match="vs dynamic"):
        export_model(cfg, output_dir=str(tmp_path / "checked"), model=Tiny(), onnx=True, check_batch_sizes=(1,),
                     atol=-1.0, rtol=0.0)
    report = export_model(cfg, output_dir=str(tmp_path / "unchecked"), model=Tiny(), onnx=True, check=False,
                          check_batch_sizes=(1,), atol=-1.0, rtol=0.0)
    assert report["checks"] == {} and os.path.isfile(report["onnx_file"])
    assert "export_check" not in read_meta(str(tmp_path / "unchecked"))


def test_program_formats_are_detected_from_files(tmp_path):
    paddle.seed(0)
    model = Tiny()
    model.eval()
    legacy = save_classifier(model, str(tmp_path / "legacy"), 16, 16, fmt="program")
    assert legacy.format == "program" and legacy.model_file.endswith("inference.pdmodel")
    pir = save_classifier(model, str(tmp_path / "pir"), 16, 16, output="probabilities", fmt="pir")
    assert pir.format == "pir" and pir.model_file.endswith("inference.json")
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype("float32")
    from ppdlx.export.paddle_export import PaddleInferenceRunner
    logits = model(paddle.to_tensor(x)).numpy()
    np.testing.assert_allclose(PaddleInferenceRunner(legacy).run({"image": x})[0], logits, atol=1e-5)
    probs = PaddleInferenceRunner(pir).run({"image": x})[0]
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)  # probabilities, not argmax
    np.testing.assert_allclose(probs, paddle.nn.functional.softmax(paddle.to_tensor(logits)).numpy(), atol=1e-5)
    # re-exporting in the other format replaces the old files (no stale second program), and the engines
    # deploy/ built from the old export in its default cache folders go with them
    for cache in ("_trt_cache/subgraph_fp16_0123", "_openvino_cache"):
        os.makedirs(tmp_path / "legacy" / cache)
        (tmp_path / "legacy" / cache / "trt_serialized_1").write_bytes(b"engine")
    again = save_classifier(model, str(tmp_path / "legacy"), 16, 16, fmt="pir")
    assert again.format == "pir" and not os.path.exists(str(tmp_path / "legacy" / "inference.pdmodel"))
    assert sorted(os.listdir(tmp_path / "legacy")) == ["inference.json", "inference.pdiparams"]
    open(tmp_path / "legacy" / "inference.pdmodel", "wb").close()
    with pytest.raises(ConfigError, match="both inference.json and inference.pdmodel"):
        find_model_files(str(tmp_path / "legacy"))
    with pytest.raises(ConfigError, match="no exported program"):
        find_model_files(str(tmp_path))


def test_export_cli_one_line_error_and_output_dir_default(tmp_path):
    tool = os.path.join(ROOT, "tools", "export_model.py")
    proc = subprocess.run([sys.executable, tool, "-c", "configs/demo/rn50_demo.yaml", "-o", "model.num_classes=3", "data.transforms.crop_size=32",
                           "data.transforms.resize_short=32", f"global.output_dir={tmp_path}",
                           "data.root=/nonexistent", "model.weights=/nonexistent/ckpt"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2
    err = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "model.weights=/nonexistent/ckpt" in err[0] and "Traceback" not in proc.stderr


def test_2_4_sparse_model_stays_2_4_after_export(tmp_path):
    """ASP (issue 5): a 2:4-pruned model exports and `tools/prune_asp.py --check` passes on the
    exported parameters."""
    import ppdlx.sparsity.check  # noqa: F401  (tools/prune_asp.py --check needs it)
    from ppdlx.sparsity.masks import compute_mask
    cfg = small_cfg("resnet18_bottleneck_tiny")
    model = small_model(cfg)
    pruned = 0
    for layer in model.sublayers():
        if isinstance(layer, paddle.nn.Conv2D) and layer.weight.shape[1] % 4 == 0:
            w = layer.weight.numpy()
            layer.weight.set_value(w * compute_mask(w, "conv2d"))
            pruned += 1
    assert pruned > 5
    out = tmp_path / "inference"
    export_model(cfg, output_dir=str(out), model=model, check_batch_sizes=(2,), atol=TOL, rtol=0.0)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "prune_asp.py"), "--check", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "0 violating" in proc.stdout


def test_efficientdet_export_with_postprocess_in_graph(tmp_path):
    """Detection: image + image_scale in, boxes/scores/classes/count out (NMS in the graph);
    Paddle Inference reproduces the dynamic model (batch 2 in the export check, batch 1 through
    deploy/python/infer.py's predictor), and infer.py reads the detections."""
    import ppdlx.models.efficientdet  # noqa: F401
    from ppdlx.models.detection.det_postprocess import EfficientDetPostProcess
    from ppdlx.export.paddle_export import DetectorForExport
    # a COCO config: its task plug-in (detection) supplies the export spec
    cfg = small_cfg("efficientdet_d0", **{"model.args": "{image_size: 128}", "model.num_classes": 3,
                                          "data.dataset": "coco"})
    paddle.seed(0)
    model = build_model(cfg)
    model.eval()
    report = export_model(cfg, output_dir=str(tmp_path), model=model, check_batch_sizes=(2,), atol=TOL, rtol=0.0)
    assert report["family"] == "detection"
    assert [i["name"] for i in report["inputs"]] == ["image", "image_scale"]
    assert [o["role"] for o in report["outputs"]] == ["boxes", "scores", "classes", "count"]
    assert report["checks"]["paddle_inference_bs2_max_abs_diff"] <= TOL
    D = load_deploy_module()
    meta = D.load_meta(str(tmp_path))
    assert meta["preprocess"]["type"] == "resize_long_pad" and meta["preprocess"]["size"] == 128
    pred = D.PaddlePredictor(str(tmp_path), threads=1, meta=meta)
    feeds = D.Preprocessor(meta).feeds([Image.new("RGB", (256, 128), (120, 90, 60))])
    assert feeds["image_scale"].tolist() == [2.0]
    outputs = pred.run(feeds)
    post = EfficientDetPostProcess.from_model(model, pre_nms_top_k=meta["postprocess"]["pre_nms_top_k"])
    reference = run_dynamic(DetectorForExport(model, post), meta["inputs"], feeds)
    for got, ref in zip(outputs, reference):
        assert got.shape == ref.shape and float(np.abs(got.astype("float64") - ref).max()) <= TOL
    boxes, scores, classes, count = outputs
    assert boxes.shape == (1, 100, 4) and scores.shape == (1, 100) and count.shape == (1,)
    dets = D.postprocess(meta, outputs, score_threshold=0.0)[0]
    assert len(dets) == int(count[0]) > 0 and all(0 <= d[2] < 3 for d in dets)


class Gate(paddle.nn.Layer):
    """A squeeze-excite-like gate (GPUNet, EfficientNet, EfficientDet use F.sigmoid)."""

    def __init__(self, activation):
        super().__init__()
        self.num_classes, self.data_format, self.activation = 4, "NCHW", activation
        self.conv = paddle.nn.Conv2D(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return (y * getattr(paddle.nn.functional, self.activation)(y)).mean(axis=[2, 3])  # looked up as models do


def test_legacy_program_export_traces_sigmoid_and_refuses_other_pir_only_ops_in_one_line(tmp_path):
    """Paddle 3.3's sigmoid (and tanh, exp, ...) Python API is a PIR-only C++ binding: before, a legacy
    .pdmodel of any model with a squeeze-excite gate failed with a multi-line TypeError from dy2static.
    sigmoid is now traced as the legacy op (GPUNet and EfficientNet export as .pdmodel); any other such
    op is one line naming it and the route that remains (PIR .json + paddle.tensorrt)."""
    paddle.seed(0)
    gate = Gate("sigmoid")
    files = save_classifier(gate, str(tmp_path / "legacy"), 8, 8, fmt="program")
    assert files.format == "program" and paddle.nn.functional.sigmoid.__module__.startswith("paddle")
    x = np.random.RandomState(0).rand(2, 3, 8, 8).astype("float32")
    got = PaddleInferenceRunner(files).run({"image": x})[0]
    assert float(np.abs(got - gate(paddle.to_tensor(x)).numpy()).max()) < 1e-5
    with pytest.raises(UnsupportedError) as err:
        save_classifier(Gate("tanh"), str(tmp_path / "tanh"), 8, 8, fmt="program")
    assert str(err.value) == (
        f"--format program: Paddle {paddle.__version__} cannot trace tanh() into a legacy .pdmodel (its API "
        f"takes PIR values only); export the default PIR .json (--format pir), which deploy --backend trt runs "
        f"through paddle.tensorrt")
    assert save_classifier(Gate("tanh"), str(tmp_path / "pir"), 8, 8, fmt="pir").format == "pir"


def test_efficientdet_legacy_export_is_refused_in_one_line_naming_the_op(tmp_path):
    # Before: with sigmoid traced, the detector's next PIR-only op surfaced as dy2static's multi-line
    # ValueError ("sum(): argument (position 1) must be Value, but got None").
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_model.py"), "-c",
                           "configs/demo/efficientdet_demo.yaml", "--format", "program", "--no-check",
                           "--random-weights", "--output-dir", str(tmp_path / "legacy")], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)
    assert proc.returncode == 3, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: --format program: Paddle {paddle.__version__} cannot trace sum() into a legacy "
                      f".pdmodel (its API takes PIR values only); export the default PIR .json (--format pir), "
                      f"which deploy --backend trt runs through paddle.tensorrt"]
    assert "Traceback" not in proc.stderr


def test_export_tools_ask_for_weights_and_a_random_export_says_so_in_deploy(tmp_path):
    """Without model.weights the export tools would deploy random initial values: they stop in one
    line unless --random-weights is given; such an export is marked in inference.yml and deploy's
    infer.py says its predictions mean nothing. A weighted export carries no mark."""
    tool = os.path.join(ROOT, "tools", "export_model.py")
    common = ["-c", "configs/demo/rn50_demo.yaml", "-o", "model.name=resnet18_bottleneck_tiny", "model.num_classes=3",
              "data.transforms.crop_size=32", "data.transforms.resize_short=36", f"global.output_dir={tmp_path}"]
    out = tmp_path / "random"
    for script, extra in ((tool, ["--output-dir", str(out)]),
                          (os.path.join(ROOT, "tools", "quantize.py"),
                           ["--calib-images", str(tmp_path), "--output-dir", str(tmp_path / "int8")])):
        proc = subprocess.run([sys.executable, script, *common, *extra], capture_output=True, text=True, timeout=300,
                              cwd=ROOT)
        what = "export" if script == tool else "quantise"
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert proc.stderr.strip().splitlines()[-1] == (
            f"error: model.weights is not set: pass -o model.weights=<checkpoint prefix> (trained, or converted by "
            f"tools/convert_weights.py), or --random-weights to {what} randomly initialised weights (speed tests)")
    assert not out.exists() and not (tmp_path / "int8").exists()
    proc = subprocess.run([sys.executable, tool, *common, "--output-dir", str(out), "--random-weights"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert read_meta(str(out))["model"]["random_weights"] is True
    image = tmp_path / "one.png"
    Image.new("RGB", (40, 36), (200, 30, 60)).save(image)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "deploy", "python", "infer.py"), "--model-dir", str(out),
                           "--input", str(image), "--backend", "paddle-cpu"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ("# inference.yml: exported without model.weights (randomly initialised weights): the predictions mean "
            "nothing; re-export with -o model.weights=<checkpoint prefix>") in proc.stderr.splitlines()
    cfg = load_config(None, [*common[3:], "model.weights=" + str(tmp_path / "w")])
    paddle.save(build_model(cfg).state_dict(), str(tmp_path / "w.pdparams"))
    weighted = export_model(cfg, output_dir=str(tmp_path / "weighted"), check=False)
    assert "random_weights" not in read_meta(weighted["model_dir"])["model"]
