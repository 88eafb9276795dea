"""deploy/c builds against a real Paddle Inference C library when one is given by
PADDLE_INFERENCE_C_DIR (not installable here: skipped otherwise, never stubbed)."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIB_DIR = os.environ.get("PADDLE_INFERENCE_C_DIR", "")
HEADER = os.path.join(LIB_DIR, "paddle", "include", "pd_inference_api.h")


@pytest.mark.skipif(not os.path.isfile(HEADER), reason="set PADDLE_INFERENCE_C_DIR to an unpacked Paddle "
                                                      "Inference C library (deploy/c/README.md)")
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")
def test_c_program_builds_against_the_c_library(tmp_path):
    build = tmp_path / "build"
    subprocess.run(["cmake", "-S", os.path.join(ROOT, "deploy", "c"), "-B", str(build),
                    f"-DPADDLE_INFERENCE_C_DIR={LIB_DIR}"], check=True, capture_output=True, timeout=300)
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True, timeout=300)
    assert (build / "ppdlx_infer").is_file()


DRIVER = r"""
#include "model_select.h"
int main(int argc, char **argv) {
  if (argc == 3) { printf("%d\n", ppdlx_count_files_with_prefix(argv[1], argv[2])); return 0; }
  ProgramChoice choice;
  char why[1024], cache[PPDLX_PATH_MAX];
  int code = ppdlx_choose_program(argv[1], argv[2], argv[3], &choice, why, sizeof why);
  if (!code && argc == 6)  /* MODEL_DIR BACKEND PRECISION CACHE_BASE SETTINGS: the engine folder */
    code = ppdlx_engine_cache_dir(argv[4], &choice, argv[3], argv[5], cache, sizeof cache, why, sizeof why);
  if (code) { fprintf(stderr, "error: %s\n", why); return code; }
  if (argc == 6) { printf("%s\n", cache); return 0; }
  printf("%s %s %s %d\n", choice.engine, choice.prog, choice.params, choice.quantized);
  return 0;
}
"""


@pytest.fixture(scope="module")
def select_program(tmp_path_factory):
    """deploy/c/model_select.h (what infer.c decides with, libc only) built into a small driver."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler")
    build = tmp_path_factory.mktemp("select")
    (build / "driver.c").write_text(DRIVER)
    exe = build / "select"
    subprocess.run([compiler, "-std=c99", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra", "-Werror",
                    "-I", os.path.join(ROOT, "deploy", "c"), str(build / "driver.c"), "-o", str(exe)],
                   check=True, capture_output=True, timeout=120)

    def run(*args):
        return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60)
    return run


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Real exports: the same conv net as PIR .json and legacy .pdmodel, and a legacy QAT-style one."""
    import paddle
    from paddle.nn.quant.format import LinearDequanter, LinearQuanter
    from ppdlx.export.paddle_export import save_classifier
    layer = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3, padding=1), paddle.nn.AdaptiveAvgPool2D(1),
                                 paddle.nn.Flatten())
    out = {fmt: save_classifier(layer, str(tmp_path_factory.mktemp(fmt)), 8, 8, fmt=fmt).model_dir
           for fmt in ("pir", "program")}
    qat = paddle.nn.Sequential(LinearQuanter([0.05], zero_point=[0.0], bit_length=8),
                               LinearDequanter([0.05], zero_point=[0.0], bit_length=8), layer)
    out["qat"] = save_classifier(qat, str(tmp_path_factory.mktemp("qat")), 8, 8, fmt="program").model_dir
    return out


def assert_refused(proc, message):
    """Exit 3 (a combination that would not run as asked), nothing on stdout, one error line."""
    assert proc.returncode == 3 and proc.stdout == ""
    assert proc.stderr == f"error: {message}\n"


def test_c_program_refuses_trt_on_a_pir_export(select_program, exported):
    """Before: infer.c called PD_ConfigEnableTensorRtEngine on inference.json, which the PIR pipeline
    ignores (plain fp32 CUDA reported as "backend trt fp16")."""
    assert_refused(select_program(exported["pir"], "trt", "fp16"),
                   "--backend trt: inference.json is a PIR program, which Paddle Inference's TensorRT subgraph engine "
                   "(PD_ConfigEnableTensorRtEngine) skips, and the C API has no PIR-TRT converter; re-export with "
                   "tools/export_model.py --format program, or run deploy/python/infer.py --backend trt "
                   "(paddle.tensorrt)")
    cpu = select_program(exported["pir"], "cpu", "fp32")
    assert cpu.returncode == 0 and cpu.stdout.split()[:2] == ["onednn", os.path.join(exported["pir"], "inference.json")]


def test_c_program_routes_a_legacy_export_like_the_python_plan(select_program, exported):
    from benchmarks.infer import load_deploy_module
    D = load_deploy_module()
    proc = select_program(exported["program"], "trt", "fp16")
    engine, prog, params, quantized = proc.stdout.split()
    assert proc.returncode == 0 and prog == os.path.join(exported["program"], "inference.pdmodel")
    assert params == os.path.join(exported["program"], "inference.pdiparams") and quantized == "0"
    files = {"format": "program", "model_file": prog, "params_file": params}
    meta = {"tensorrt": {"shape_range": {"image": {"min": [1, 3, 8, 8], "opt": [1, 3, 8, 8], "max": [8, 3, 8, 8]}}}}
    assert engine == D.build_plan(meta, files, "trt", "fp16")["engine"] == "paddle-trt-subgraph"
    # int8 without quantize ops: the C program cannot calibrate, so it refuses
    int8 = select_program(exported["program"], "trt", "int8")
    assert int8.returncode == 3 and "has no quantize ops and this program does not calibrate" in int8.stderr
    assert select_program(exported["program"], "gpu", "int8").returncode == 3
    # a QAT export's quantize ops are found among the program's op types (not in its op version map,
    # which names every registered op in every .pdmodel)
    qat = select_program(exported["qat"], "trt", "int8")
    assert qat.returncode == 0 and qat.stdout.split()[0] == "paddle-trt-subgraph" and qat.stdout.split()[3] == "1"
    assert D.is_quantized(os.path.join(exported["qat"], "inference.pdmodel"))
    assert select_program(exported["program"], "gpu", "fp16").stdout.split()[0] == "cuda"


def test_c_program_file_checks(select_program, exported, tmp_path):
    both = tmp_path / "both"
    both.mkdir()
    for name in ("inference.json", "inference.pdmodel", "inference.pdiparams"):
        shutil.copy(os.path.join(exported["pir" if name != "inference.pdmodel" else "program"], name), both / name)
    proc = select_program(str(both), "cpu", "fp32")
    assert proc.returncode == 2 and "both inference.json and inference.pdmodel exist" in proc.stderr
    (both / "inference.json").unlink()
    (both / "inference.pdiparams").unlink()
    assert "inference.pdiparams is missing" in select_program(str(both), "trt", "fp32").stderr
    # the engine evidence infer.c checks after its first TRT run
    assert select_program(str(tmp_path), "trt_serialized_").stdout == "0\n"
    (tmp_path / "trt_serialized_42").write_bytes(b"x")
    assert select_program(str(tmp_path), "trt_serialized_").stdout == "1\n"


def test_c_program_keeps_engines_per_model_content_and_settings(select_program, exported, tmp_path):
    """Before: infer.c serialised every engine straight into --trt-cache (default MODEL_DIR), where
    Paddle's engine names (variable names only) let a retrained model load the old engine."""
    def engine_dir(model_dir, precision="fp16", settings="max_batch=8 opt_batch=1 size=8x8 layout=NCHW"):
        proc = select_program(model_dir, "trt", precision, str(tmp_path / "cache"), settings)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    first = engine_dir(exported["program"])
    assert os.path.dirname(first) == str(tmp_path / "cache") and os.path.basename(first).startswith("subgraph_fp16_")
    # created with its parents: Paddle's PD_ConfigSetOptimCacheDir makes only the last folder
    assert os.path.isdir(first)
    (tmp_path / "file").write_text("")
    blocked = select_program(exported["program"], "trt", "fp16", str(tmp_path / "file" / "cache"), "max_batch=8")
    assert blocked.returncode == 2 and blocked.stderr.startswith(
        f"error: --trt-cache {tmp_path / 'file' / 'cache'}: cannot create {tmp_path / 'file' / 'cache'}/subgraph_fp16_")
    assert engine_dir(exported["program"]) == first
    retrained = tmp_path / "retrained"
    shutil.copytree(exported["program"], retrained)
    with open(retrained / "inference.pdiparams", "r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(b"\x00\x00\x00\x3f")
    others = {engine_dir(str(retrained)), engine_dir(exported["program"], "fp32"),
              engine_dir(exported["program"], settings="max_batch=256 opt_batch=1 size=8x8 layout=NCHW")}
    assert first not in others and len(others) == 3


def test_c_program_refuses_trt_on_an_nhwc_program_the_nhwc_pass_stops_on(select_program, tmp_path):
    """Before: infer.c built the TRT predictor on an NHWC program with a depthwise convolution, which
    trt_support_nhwc_pass stops on ("op not supported"); now it refuses it before, like the Python plan."""
    import paddle
    from benchmarks.infer import load_deploy_module
    from ppdlx.export.paddle_export import save_classifier
    D = load_deploy_module()

    def nhwc(*extra):
        return paddle.nn.Sequential(paddle.nn.Conv2D(3, 8, 3, padding=1, data_format="NHWC"), *extra,
                                    paddle.nn.ReLU(), paddle.nn.AdaptiveAvgPool2D(1, data_format="NHWC"),
                                    paddle.nn.Flatten())
    dirs = {name: save_classifier(layer, str(tmp_path / name), 8, 8, data_format="NHWC", fmt="program").model_dir
            for name, layer in (("plain", nhwc()),
                                ("depthwise",
                                 nhwc(paddle.nn.Conv2D(8, 8, 3, padding=1, groups=8, data_format="NHWC"))))}
    assert D.trt.nhwc_ops_the_pass_cannot_switch(os.path.join(dirs["depthwise"], "inference.pdmodel")) == \
        ["depthwise_conv2d"]
    assert_refused(select_program(dirs["depthwise"], "trt", "fp16"),
                   "--backend trt: inference.pdmodel is an NHWC program with depthwise_conv2d ops, which Paddle-TRT's "
                   "trt_support_nhwc_pass cannot turn to NCHW (it stops building the predictor); re-export with "
                   "-o export.data_format=NCHW (the same weights)")
    plain = select_program(dirs["plain"], "trt", "fp16")
    assert D.trt.nhwc_ops_the_pass_cannot_switch(os.path.join(dirs["plain"], "inference.pdmodel")) == []
    assert plain.returncode == 0 and plain.stdout.split()[0] == "paddle-trt-subgraph"
    assert select_program(dirs["depthwise"], "gpu", "fp16").stdout.split()[0] == "cuda"


def test_infer_c_decides_through_model_select():
    with open(os.path.join(ROOT, "deploy", "c", "infer.c"), encoding="utf-8") as f:
        source = f.read()
    assert '#include "model_select.h"' in source and "ppdlx_choose_program(" in source
    assert 'ppdlx_count_files_with_prefix(cache, "trt_serialized_")' in source
    assert "ppdlx_engine_cache_dir(base, &choice" in source and "PD_ConfigSetOptimCacheDir(config, cache)" in source
    assert "inference.json" not in source.split("int main", 1)[1]  # no second, divergent file choice
