"""deploy/python/ppdlx_deploy/trt.py: --backend trt takes Paddle's TensorRT integration that the
export's program format really reaches (the subgraph engine for a legacy .pdmodel, paddle.tensorrt
for a PIR .json), refuses in one line what would silently run on plain CUDA, calibrates int8 with
the serving plan (--gpu-id included), and reports the engine that ran. No GPU here: plans and the
evidence checks run on CPU against real exports and the real Config/PIR objects."""
import importlib.util
import os
import shutil

import numpy as np
import paddle
import paddle.nn as nn
import pytest
import yaml

from benchmarks.infer import load_deploy_module
from ppdlx.config import load_config
from ppdlx.export import export_model

D = load_deploy_module()
T = D.trt
HAS_PIR_TRT = importlib.util.find_spec("paddle.tensorrt") is not None


class ConvNet(nn.Layer):
    def __init__(self, num_classes=3):
        super().__init__()
        self.num_classes, self.data_format = num_classes, "NCHW"
        self.body = nn.Sequential(nn.Conv2D(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2D(1), nn.Flatten(),
                                  nn.Linear(8, num_classes))

    def forward(self, x):
        return self.body(x)


def _calls(plan, name):
    return [c for c in plan["calls"] if c["call"] == name]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """The same tiny classifier exported as a PIR .json and as a legacy .pdmodel."""
    cfg = load_config(None, ["model.num_classes=3", "data.transforms.crop_size=32", "data.transforms.resize_short=36",
                             "data.root=/nonexistent"])
    out = {}
    for fmt in ("pir", "program"):
        paddle.seed(0)
        out[fmt] = str(tmp_path_factory.mktemp(fmt))
        export_model(cfg, output_dir=out[fmt], model=ConvNet(), fmt=fmt, check_batch_sizes=(1,))
    return out


def _plan(model_dir, backend, precision, **kwargs):
    meta = D.load_meta(model_dir)
    return D.build_plan(meta, D.model_files(model_dir, meta), backend, precision, **kwargs)


@pytest.mark.skipif(HAS_PIR_TRT, reason="the refusal is for Paddle builds without paddle.tensorrt")
@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_pir_export_on_trt_is_refused_without_paddle_tensorrt(exports, precision):
    """Before: the plan called enable_tensorrt_engine on the .json, which Paddle's PIR pipeline
    ignores (plain fp32 CUDA reported as Paddle-TRT)."""
    with pytest.raises(D.UnsupportedError) as err:
        _plan(exports["pir"], "trt", precision)
    assert str(err.value) == (
        "--backend trt: inference.json is a PIR program, which Paddle Inference's TensorRT subgraph engine "
        "(enable_tensorrt_engine) skips, and paddle.tensorrt (PIR-TRT) cannot be used here (ModuleNotFoundError: "
        "No module named 'paddle.tensorrt'); install paddlepaddle-gpu built with TensorRT plus the tensorrt wheel, "
        "or re-export with tools/export_model.py --format program (a legacy .pdmodel for the subgraph engine)")
    assert "\n" not in str(err.value)


def test_pir_export_plan_goes_through_paddle_tensorrt(exports, tmp_path):
    cache = str(tmp_path / "cache")
    plan = _plan(exports["pir"], "trt", "fp16", batch_size=8, cache_dir=cache, gpu_mem_mb=512,
                 pir_trt_available=True)
    assert plan["engine"] == "pir-trt" and plan["notes"][0].startswith("engine pir-trt:")
    # the converted program carries the TRT engines: a plain GPU predictor runs it, no subgraph calls
    assert [(c["call"], c["args"], c["kwargs"]) for c in plan["calls"]] == [
        ("enable_use_gpu", [512, 0], {"precision_mode": "Float32"}), ("switch_ir_optim", [True], {})]
    folder = os.path.dirname(plan["model_file"])
    assert os.path.dirname(folder) == cache and os.path.basename(folder).startswith("pir_trt_fp16_")
    assert plan["model_file"] == os.path.join(folder, "inference.json")
    assert plan["params_file"] == os.path.join(folder, "inference.pdiparams")
    spec = plan["pir_trt"]
    assert spec["source_model"] == os.path.join(exports["pir"], "inference.json")
    assert (spec["precision"], spec["workspace_size"], spec["min_subgraph_size"]) == ("FP16", 1 << 30, 3)
    assert spec["inputs"] == [{"name": "image", "min": [1, 3, 32, 32], "opt": [8, 3, 32, 32],
                               "max": [256, 3, 32, 32]}]
    # what a reused conversion must match: the model bytes and every conversion setting
    env = {"gpu": "A100", "tensorrt": "10.0", "paddle": "3.3"}
    key = T.pir_trt_key(spec, None, env)
    assert key["precision"] == "FP16" and len(key["model_sha256"]) == 64 and key["gpu"] == "A100"
    fp32 = _plan(exports["pir"], "trt", "fp32", batch_size=8, cache_dir=cache, pir_trt_available=True)
    assert T.pir_trt_key(fp32["pir_trt"], None, env) != key
    assert os.path.basename(os.path.dirname(fp32["model_file"])).startswith("pir_trt_fp32_")


def test_pir_trt_refuses_calibration_and_other_gpus(exports):
    with pytest.raises(D.UnsupportedError) as err:
        _plan(exports["pir"], "trt", "int8", pir_trt_available=True)
    assert str(err.value) == (
        "--backend trt --precision int8: paddle.tensorrt (the route of PIR .json exports) takes int8 scales only "
        "from a QAT/PTQ export's quantize ops and cannot calibrate; quantise the model, or re-export with "
        "tools/export_model.py --format program (a legacy .pdmodel for the subgraph engine) and calibrate with "
        "--calib-dir")
    assert _plan(exports["pir"], "trt", "int8", quantized=True, pir_trt_available=True)["pir_trt"]["precision"] == \
        "INT8"
    with pytest.raises(D.UnsupportedError) as err:
        _plan(exports["pir"], "trt", "fp16", gpu_id=2, pir_trt_available=True)
    assert str(err.value) == ("--backend trt --gpu-id 2: paddle.tensorrt converts PIR programs on GPU 0 only; "
                              "select the card with CUDA_VISIBLE_DEVICES=2 and --gpu-id 0")


class NHWCConvNet(ConvNet):
    def __init__(self):
        super().__init__()
        self.data_format = "NHWC"
        self.body = nn.Sequential(nn.Conv2D(3, 8, 3, padding=1, bias_attr=False, data_format="NHWC"), nn.ReLU(),
                                  nn.AdaptiveAvgPool2D(1, data_format="NHWC"), nn.Flatten(), nn.Linear(8, 3))


def test_pir_trt_refuses_an_nhwc_graph(tmp_path):
    """paddle.tensorrt marks pd_op.conv2d convertible whatever its data_format and builds an NCHW
    TensorRT convolution from it; the legacy subgraph route transposes NHWC ops first
    (trt_support_nhwc_pass), so only the PIR route is refused."""
    cfg = load_config(None, ["model.num_classes=3", "data.transforms.crop_size=32", "data.transforms.resize_short=36",
                             "data.root=/nonexistent", "export.data_format=NHWC"])
    dirs = {}
    for fmt in ("pir", "program"):
        dirs[fmt] = str(tmp_path / fmt)
        export_model(cfg, output_dir=dirs[fmt], model=NHWCConvNet(), fmt=fmt, check_batch_sizes=(1,))
    with pytest.raises(D.UnsupportedError) as err:
        _plan(dirs["pir"], "trt", "fp16", pir_trt_available=True)
    assert str(err.value) == ("--backend trt: inference.json is an NHWC graph and paddle.tensorrt converts "
                              "convolutions as NCHW; re-export with -o export.data_format=NCHW (the same weights)")
    assert _plan(dirs["program"], "trt", "fp16")["engine"] == "paddle-trt-subgraph"
    assert _plan(dirs["pir"], "paddle-gpu", "fp16")["engine"] == "cuda"


class NHWCDepthwiseNet(ConvNet):
    def __init__(self):
        super().__init__()
        self.data_format = "NHWC"
        self.body = nn.Sequential(nn.Conv2D(3, 8, 3, padding=1, bias_attr=False, data_format="NHWC"),
                                  nn.Conv2D(8, 8, 3, padding=1, groups=8, bias_attr=False, data_format="NHWC"),
                                  nn.ReLU(), nn.AdaptiveAvgPool2D(1, data_format="NHWC"), nn.Flatten(), nn.Linear(8, 3))


def test_legacy_trt_refuses_an_nhwc_program_whose_ops_the_nhwc_pass_cannot_switch(tmp_path):
    """trt_support_nhwc_pass turns NHWC conv2d / pool2d / batch_norm / interp / prelu to NCHW and stops
    with "op not supported" on any other NHWC op with 4-D inputs: a depthwise convolution (GPUNet,
    EfficientNet) is refused before the predictor is built; the plain NHWC conv net is not."""
    cfg = load_config(None, ["model.num_classes=3", "data.transforms.crop_size=32", "data.transforms.resize_short=36",
                             "data.root=/nonexistent", "export.data_format=NHWC"])
    depthwise, plain = str(tmp_path / "dw"), str(tmp_path / "plain")
    export_model(cfg, output_dir=depthwise, model=NHWCDepthwiseNet(), fmt="program", check_batch_sizes=(1,))
    export_model(cfg, output_dir=plain, model=NHWCConvNet(), fmt="program", check_batch_sizes=(1,))
    model_file = os.path.join(depthwise, "inference.pdmodel")
    assert T.nhwc_ops_the_pass_cannot_switch(model_file) == ["depthwise_conv2d"]
    assert T.nhwc_ops_the_pass_cannot_switch(os.path.join(plain, "inference.pdmodel")) == []
    with pytest.raises(D.UnsupportedError) as err:
        _plan(depthwise, "trt", "fp16")
    assert str(err.value) == ("--backend trt: inference.pdmodel is an NHWC program with depthwise_conv2d ops, which "
                              "Paddle-TRT's trt_support_nhwc_pass cannot turn to NCHW (it stops building the "
                              "predictor); re-export with -o export.data_format=NCHW (the same weights)")
    assert _plan(plain, "trt", "fp16")["engine"] == "paddle-trt-subgraph"
    assert _plan(depthwise, "paddle-gpu", "fp16")["engine"] == "cuda"


def test_legacy_export_plan_uses_the_subgraph_engine(exports, tmp_path):
    plan = _plan(exports["program"], "trt", "fp16", batch_size=4, cache_dir=str(tmp_path / "c"))
    assert plan["engine"] == "paddle-trt-subgraph" and plan["pir_trt"] is None
    assert plan["model_file"] == os.path.join(exports["program"], "inference.pdmodel")
    assert _calls(plan, "enable_tensorrt_engine")[0]["kwargs"]["precision_mode"] == "Half"
    assert _calls(plan, "enable_new_ir")[0]["args"] == [False]


def test_calibration_uses_the_serving_plan_and_gpu_id(exports, tmp_path):
    """Before: _calibrate built its predictor without --gpu-id (always GPU 0), --gpu-mem-mb or
    --trt-shapes, so the table could belong to other engines than the ones served."""
    args = D.cli.parse_args(["--model-dir", exports["program"], "--backend", "trt", "--precision", "int8",
                             "--gpu-id", "3", "--gpu-mem-mb", "512", "--batch-size", "4",
                             "--trt-cache-dir", str(tmp_path / "c"), "--calib-dir", str(tmp_path)])
    meta = D.load_meta(exports["program"])
    plan = D.cli.calibration_plan(args, meta)
    assert _calls(plan, "enable_use_gpu")[0]["args"] == [512, 3]
    trt = _calls(plan, "enable_tensorrt_engine")[0]["kwargs"]
    assert trt["precision_mode"] == "Int8" and trt["use_calib_mode"] is True
    assert plan["calibration"] is True and os.path.dirname(plan["cache_dir"]) == str(tmp_path / "c")
    serving = D.build_plan(meta, D.model_files(exports["program"], meta), "trt", "int8", **D.cli.plan_options(args))
    assert serving["calls"] == plan["calls"]


def test_subgraph_engines_are_kept_per_model_content_and_settings(exports, tmp_path, monkeypatch):
    """Paddle names a serialised subgraph engine after its variable names only, so before, a retrained
    model re-exported with the same architecture (or another max batch) loaded the old engine from the
    shared MODEL_DIR/_trt_cache, old weights included."""
    def engine_dir(model_dir, precision="fp16", **kwargs):
        plan = _plan(model_dir, "trt", precision, cache_dir=str(tmp_path / "c"), **kwargs)
        assert _calls(plan, "set_optim_cache_dir")[0]["args"] == [plan["cache_dir"]]
        return plan["cache_dir"]

    first = engine_dir(exports["program"])
    assert os.path.dirname(first) == str(tmp_path / "c") and first == engine_dir(exports["program"])
    retrained = _retrained_copy(exports["program"], str(tmp_path / "retrained"))
    others = {engine_dir(retrained), engine_dir(exports["program"], trt_max_batch=32),
              engine_dir(exports["program"], "fp32"), engine_dir(exports["program"], batch_size=4)}
    assert first not in others and len(others) == 4
    monkeypatch.chdir(tmp_path)  # a relative --trt-cache-dir is made absolute
    plan = _plan(exports["program"], "trt", "fp16", cache_dir="c")
    assert plan["cache_dir"] == first


def _retrained_copy(model_dir, copy):
    """The same program with other weights (the last value of the weights file), recorded in inference.yml."""
    shutil.copytree(model_dir, copy)
    with open(os.path.join(copy, "inference.pdiparams"), "r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(np.float32(0.5).tobytes())
    with open(os.path.join(copy, "inference.yml"), encoding="utf-8") as f:
        meta = yaml.safe_load(f)
    meta["files"]["inference.pdiparams"]["sha256"] = D.integrity.file_digest(os.path.join(copy, "inference.pdiparams"))
    with open(os.path.join(copy, "inference.yml"), "w", encoding="utf-8") as f:
        yaml.safe_dump(meta, f)
    return copy


def test_pir_conversions_are_kept_per_model_content_settings_and_place(exports, tmp_path):
    """paddle.tensorrt names engine files after the graph's structure only. Before, every model and
    setting was converted into CACHE/pir_trt_<precision>/: models sharing a --trt-cache-dir reconverted
    each other on every run (minutes each). And the converted program records its engines' absolute
    paths while its key left its own place out, so a copied export's conversion (copied with the
    export's _trt_cache) was taken as current and loaded the engines of the folder it came from."""
    env = {"paddle": "3.3.1", "tensorrt": "10.5.0", "gpu": "NVIDIA A100-SXM4-80GB", "capability": [8, 0]}
    cache = str(tmp_path / "shared")

    def spec(model_dir, precision="fp16", **kwargs):
        kwargs.setdefault("cache_dir", cache)
        kwargs.setdefault("trt_environment", env)
        return _plan(model_dir, "trt", precision, pir_trt_available=True, **kwargs)["pir_trt"]

    first = spec(exports["pir"])
    assert spec(exports["pir"])["save_prefix"] == first["save_prefix"]
    retrained = _retrained_copy(exports["pir"], str(tmp_path / "retrained"))
    others = {spec(retrained)["save_prefix"], spec(exports["pir"], trt_max_batch=64)["save_prefix"],
              spec(exports["pir"], "fp32")["save_prefix"],
              spec(exports["pir"], trt_environment=dict(env, gpu="NVIDIA A10", capability=[8, 6]))["save_prefix"]}
    assert first["save_prefix"] not in others and len(others) == 4
    assert {os.path.dirname(os.path.dirname(p)) for p in others} == {cache}
    copied = str(tmp_path / "copied")  # same bytes, default cache inside each export folder
    shutil.copytree(exports["pir"], copied)
    here, there = spec(exports["pir"], cache_dir=None), spec(copied, cache_dir=None)
    assert here["save_prefix"].startswith(exports["pir"]) and there["save_prefix"].startswith(copied)
    assert T.pir_trt_key(here, None, env) != T.pir_trt_key(there, None, env)


def test_collected_shapes_make_the_serving_batch_tensorrts_optimum(exports, tmp_path):
    """TensorRT's optimal shape is the one the collection saw most often. Before, each batch size ran
    once, so Paddle's tie-break chose it: --batch-size 8 --batch-sizes 8,32 tuned the engines for
    batch 32. Run through Paddle's real shape collection (the subgraph route's, on this CPU build)."""
    sizes = T.collection_batch_sizes(8, [8, 32])
    assert sizes == [1, 8, 32, 8] and T.collection_batch_sizes(4) == [1, 4, 4]
    plan = _plan(exports["program"], "trt", "fp16", batch_size=8, cache_dir=str(tmp_path / "c"),
                 shape_source="collect", trt_max_batch=32)
    feeds = [{"image": np.random.default_rng(n).random((n, 3, 32, 32), np.float32)} for n in sizes]
    D.predictors.collect_shape_ranges(paddle.inference, plan, D.model_files(exports["program"]), feeds)
    with open(plan["shape_file"], encoding="utf-8") as f:
        text = f.read()
    image = text[text.index('name: "image"'):].split("}")[0]
    batches = {kind: int(image.split(f"{kind}_shape:")[1].split()[0]) for kind in ("min", "max", "opt")}
    assert batches == {"min": 1, "max": 32, "opt": 8}


def test_subgraph_engines_are_kept_per_gpu_and_tensorrt_version(exports, tmp_path):
    """Before: the key held the model and settings only, so a cache built on an A100 (or with another
    TensorRT) handed its engines to an A10, where Paddle fails to deserialise them."""
    def engine_dir(**environment):
        env = dict({"paddle": "3.3.1", "tensorrt": "10.5.0", "gpu": "NVIDIA A100-SXM4-80GB", "capability": [8, 0]},
                   **environment)
        return _plan(exports["program"], "trt", "fp16", cache_dir=str(tmp_path), trt_environment=env)["cache_dir"]

    a100 = engine_dir()
    assert engine_dir() == a100
    others = {engine_dir(gpu="NVIDIA A10", capability=[8, 6]), engine_dir(tensorrt="10.6.0"),
              engine_dir(paddle="3.4.0")}
    assert a100 not in others and len(others) == 3
    here = T.trt_environment(0)  # this CPU build: no GPU, no TensorRT
    assert here["paddle"] == paddle.__version__ and here["gpu"] is None and here["tensorrt"] == "0.0.0"


def test_the_engine_cache_folder_is_created_with_its_parents(exports, tmp_path):
    """Paddle creates only the last folder of set_optim_cache_dir (one mkdir), and the subgraph plan's
    folder is CACHE/subgraph_<precision>_<key> under a CACHE that does not exist before the first run:
    building the predictor failed. Shown on a CPU predictor, where Paddle makes the same mkdir when it
    saves the optimised program."""
    cache = str(tmp_path / "cache" / "subgraph_fp32_0123")
    plan = _plan(exports["program"], "paddle-cpu", "fp32")
    calls = plan["calls"] + [D.config_calls.plan_call("set_optim_cache_dir", cache),
                             D.config_calls.plan_call("enable_save_optim_model", True)]
    config = paddle.inference.Config(plan["model_file"], plan["params_file"])
    D.config_calls.apply_plan(config, calls)
    predictor = paddle.inference.create_predictor(config)
    assert os.path.isdir(cache) and predictor.get_input_names() == ["image"]
    trt_cache = _plan(exports["program"], "trt", "fp16", cache_dir=str(tmp_path / "trt"))["cache_dir"]
    D.config_calls.apply_plan(paddle.inference.Config(plan["model_file"], plan["params_file"]),
                              [D.config_calls.plan_call("set_optim_cache_dir", trt_cache)])
    assert os.path.isdir(trt_cache)


def test_calibration_tables_are_moved_where_paddle_reads_them(exports, tmp_path):
    """Paddle writes the int8 calibration table into _opt_cache next to the program when the
    calibrating predictor is destroyed, but reads it from the optimisation cache dir: before, every
    calibration ended in "the calibration run wrote no table" and int8 was never served."""
    import time
    model_dir = str(tmp_path / "model")
    shutil.copytree(exports["program"], model_dir)
    plan = _plan(model_dir, "trt", "int8", cache_dir=str(tmp_path / "c"))
    written = os.path.join(model_dir, "_opt_cache")
    os.makedirs(written)
    stale = os.path.join(written, "trt_calib_older")
    with open(stale, "w") as f:
        f.write("an earlier run's table")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    started = time.time()
    with open(os.path.join(written, "trt_calib_7081295716"), "w") as f:
        f.write("TRT-8601-EntropyCalibration2")
    assert T.trt_calibration_tables(plan["cache_dir"]) == []
    moved = T.move_calibration_tables(plan, started)
    assert moved == [os.path.join(plan["cache_dir"], "trt_calib_7081295716")]
    assert T.trt_calibration_tables(plan["cache_dir"]) == moved and os.listdir(written) == ["trt_calib_older"]
    with open(moved[0]) as f:
        assert f.read() == "TRT-8601-EntropyCalibration2"


def test_collected_shapes_that_changed_drop_the_serialised_engines(exports, tmp_path):
    plan = _plan(exports["program"], "trt", "fp16", cache_dir=str(tmp_path / "c"), shape_source="collect")
    assert os.path.dirname(plan["shape_file"]) == plan["cache_dir"]
    os.makedirs(plan["cache_dir"])
    engine = os.path.join(plan["cache_dir"], "trt_serialized_42")
    with open(plan["shape_file"], "wb") as f:
        f.write(b"shape_info { name: 'image' max_shape: 8 }")
    open(engine, "wb").close()
    assert T.drop_engines_of_other_shapes(plan, None) == [] and os.path.isfile(engine)  # first collection
    assert T.drop_engines_of_other_shapes(plan, b"shape_info { name: 'image' max_shape: 8 }") == []
    assert T.drop_engines_of_other_shapes(plan, b"shape_info { name: 'image' max_shape: 1 }") == [engine]
    assert not os.path.exists(engine)


def test_benchmark_batches_above_the_trt_range_are_refused(exports):
    meta = D.load_meta(exports["program"])
    args = D.cli.parse_args(["--model-dir", exports["program"], "--backend", "trt", "--benchmark",
                             "--batch-sizes", "1,512"])
    with pytest.raises(D.DeployError) as err:
        D.cli.check_trt_batch_sizes(args, meta)
    assert str(err.value) == ("--batch-sizes 1,512: batch 512 is above the TensorRT shape range's max batch 256; "
                              "add --trt-max-batch 512")
    D.cli.check_trt_batch_sizes(D.cli.parse_args(["--model-dir", exports["program"], "--backend", "trt",
                                                  "--benchmark", "--batch-sizes", "1,512", "--trt-max-batch",
                                                  "512"]), meta)


def test_subgraph_engine_evidence(tmp_path):
    plan = {"cache_dir": str(tmp_path), "calibration": False}
    with pytest.raises(D.UnsupportedError) as err:
        T.subgraph_engine_count(plan)
    assert str(err.value) == (f"--backend trt: Paddle-TRT built no engine (no trt_serialized_* in {tmp_path} "
                              f"after the first run), so the model would run on plain CUDA; use --backend "
                              f"paddle-gpu for that")
    assert T.subgraph_engine_count({"cache_dir": str(tmp_path), "calibration": True}) is None  # calibrating
    (tmp_path / "_opt_cache").mkdir()
    (tmp_path / "_opt_cache" / "trt_serialized_1234").write_bytes(b"engine")
    assert T.subgraph_engine_count(plan) == 1


def test_tensorrt_engine_count_on_a_real_pir_program(exports):
    """The count the PIR-TRT conversion is checked with, on the program type paddle.tensorrt
    returns: a plain export has no pd_op.tensorrt_engine op."""
    with paddle.pir_utils.IrGuard():
        exe = paddle.static.Executor(paddle.CPUPlace())
        program, _, _ = paddle.static.load_inference_model(os.path.join(exports["pir"], "inference"), exe)
    names = [op.name() for op in program.global_block().ops]
    assert "pd_op.conv2d" in names and T.tensorrt_engine_count(program) == 0


def test_other_engines_are_named(exports):
    assert _plan(exports["pir"], "paddle-cpu", "fp32", threads=1)["engine"] == "onednn"
    openvino = _plan(exports["program"], "paddle-cpu", "fp32", threads=1, cpu_engine="openvino")
    assert openvino["engine"] == "paddle-openvino"
    assert _plan(exports["pir"], "paddle-gpu", "fp16")["engine"] == "cuda"
    assert _plan(exports["pir"], "onnxruntime", "fp32")["engine"] == "onnxruntime"


class QuantizedNet(nn.Layer):
    """A QAT-style graph: fixed-scale quantize/dequantize ops in front of a conv."""

    def __init__(self):
        super().__init__()
        from paddle.nn.quant.format import LinearDequanter, LinearQuanter
        self.num_classes = 3
        self.quant = LinearQuanter([0.05], zero_point=[0.0], bit_length=8)
        self.dequant = LinearDequanter([0.05], zero_point=[0.0], bit_length=8)
        self.conv = nn.Conv2D(3, 3, 3, padding=1)

    def forward(self, x):
        return self.conv(self.dequant(self.quant(x))).mean(axis=[2, 3])


def test_quantized_exports_are_told_from_plain_ones_by_their_ops(exports, tmp_path):
    """Before: a byte search found quantize op names in every legacy .pdmodel (its op version map
    lists all registered ops), so int8 never calibrated (use_calib_mode=False) on plain models."""
    from ppdlx.export.paddle_export import save_classifier
    plain = os.path.join(exports["program"], "inference.pdmodel")
    assert "fake_channel_wise_quantize_abs_max" in open(plain, "rb").read().decode("latin-1")  # the version map
    assert not D.is_quantized(plain) and not D.is_quantized(os.path.join(exports["pir"], "inference.json"))
    qat = save_classifier(QuantizedNet(), str(tmp_path / "qat"), 8, 8, fmt="program")
    assert {"quantize_linear", "dequantize_linear"} <= D.program_op_types(qat.model_file)
    assert D.is_quantized(qat.model_file)
    files = {"format": "program", "model_file": qat.model_file, "params_file": qat.params_file}
    plan = D.build_plan(D.load_meta(exports["program"]), files, "trt", "int8")
    assert _calls(plan, "enable_tensorrt_engine")[0]["kwargs"]["use_calib_mode"] is False
    assert plan["calibration"] is False
