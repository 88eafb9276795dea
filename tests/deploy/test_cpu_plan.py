"""paddle-cpu plan candidates (issue 17): each variant is a list of Config calls that computes the
same outputs as onnxruntime; bf16 and int8 are offered by the CPU's detected features; ``--precision
auto`` / ``cpu_variant="auto"`` pick a plan by measuring it on this machine, cached per CPU kind."""
import os

import numpy as np
import pytest

from benchmarks.infer import load_deploy_module

D = load_deploy_module()
INTEL_BF16 = {"vendor": "GenuineIntel", "model_name": "Intel Xeon (sample)",
              "flags": ["avx2", "avx512f", "avx512_vnni", "avx512_bf16"]}
AMD_AVX2 = {"vendor": "AuthenticAMD", "model_name": "AMD EPYC (sample)", "flags": ["avx2"]}


def _files(fmt, tmp_path):
    model_file = tmp_path / ("inference.pdmodel" if fmt == "program" else "inference.json")
    return {"format": fmt, "model_file": str(model_file), "params_file": str(tmp_path / "inference.pdiparams")}


def _calls(plan):
    return [(c["call"], c["args"]) for c in plan["calls"]]


def test_each_variant_is_its_config_calls(tmp_path):
    files = _files("program", tmp_path)
    base = [("disable_gpu", []), ("enable_onednn", []), ("set_cpu_math_library_num_threads", [2]),
            ("switch_ir_optim", [True]), ("enable_new_ir", [False])]

    def calls(variant):
        return _calls(D.build_plan({}, files, "paddle-cpu", "fp32", threads=2, quantized=False, cpu_variant=variant))

    assert calls("default") == base
    assert calls("memory-optim") == base + [("enable_memory_optim", [True])]
    assert calls("new-executor") == base + [("enable_new_executor", [True])]
    assert calls("mkl-fc") == base + [("disable_onednn_fc_passes", [])]
    assert calls("memory-optim+mkl-fc") == base + [("enable_memory_optim", [True]), ("disable_onednn_fc_passes", [])]
    # the OpenVINO engine caches its compiled model next to the export, not in ./__cache__ of the caller
    assert calls("openvino") == base + [("enable_openvino_engine", []),
                                        ("set_optim_cache_dir", [str(tmp_path / "_openvino_cache")])]
    assert calls("untuned") == base[:4]
    with pytest.raises(D.DeployError, match="^cpu variant 'turbo': choose from default, memory-optim, new-executor"):
        calls("turbo")


def test_variants_follow_the_export_format(tmp_path):
    assert D.cpu_variants_for("program", "fp32") == ["default", "mkl-fc", "memory-optim", "new-executor", "openvino"]
    assert D.cpu_variants_for("program", "bf16") == ["default", "mkl-fc", "memory-optim", "new-executor"]
    assert D.cpu_variants_for("pir", "fp32") == ["default", "mkl-fc"]
    files = _files("pir", tmp_path)
    with pytest.raises(D.UnsupportedError, match="^memory-optim: Paddle's predictor finds no memory_optimize_pass"):
        D.build_plan({}, files, "paddle-cpu", "fp32", quantized=False, cpu_variant="memory-optim")
    with pytest.raises(D.UnsupportedError, match="^executor new: a PIR"):
        D.build_plan({}, files, "paddle-cpu", "fp32", quantized=False, cpu_variant="new-executor")


def test_bf16_and_int8_are_offered_by_detected_features(tmp_path):
    files = _files("program", tmp_path)
    assert D.cpu_candidates("program", "auto", None, INTEL_BF16) == [("fp32", "default"), ("bf16", "default")]
    assert D.cpu_candidates("program", "auto", None, AMD_AVX2) == [("fp32", "default")]
    assert D.cpu_candidates("pir", "auto", "auto", INTEL_BF16) == [("fp32", "default"), ("fp32", "mkl-fc"),
                                                                   ("bf16", "default"), ("bf16", "mkl-fc")]
    plan = D.build_plan({}, files, "paddle-cpu", "bf16", quantized=False, cpu_flag_set=set(INTEL_BF16["flags"]))
    assert ("enable_onednn_bfloat16", []) in _calls(plan)
    with pytest.raises(D.UnsupportedError, match="^--precision bf16: this CPU has neither avx512_bf16 nor amx_bf16"):
        D.build_plan({}, files, "paddle-cpu", "bf16", quantized=False, cpu_flag_set=set(AMD_AVX2["flags"]))
    no_vnni = D.build_plan({}, files, "paddle-cpu", "int8", quantized=True, cpu_flag_set={"avx2"})
    vnni = D.build_plan({}, files, "paddle-cpu", "int8", quantized=True, cpu_flag_set={"avx2", "avx512_vnni"})
    assert any(n.startswith("int8: this CPU has no VNNI") for n in no_vnni["notes"])
    assert not any("VNNI" in n for n in vnni["notes"])
    with pytest.raises(D.UnsupportedError, match="^--backend trt --precision auto: auto is offered for paddle-cpu"):
        D.build_plan({}, files, "trt", "auto")


@pytest.mark.parametrize("fmt", ["program", "pir"])
def test_every_variant_computes_onnxruntimes_outputs(exports, fmt, tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.chdir(tmp_path)
    meta = D.load_meta(exports[fmt])
    feeds = D.synthetic_feeds(meta, 2)
    reference = D.OnnxPredictor(exports[fmt], threads=2, meta=meta).run(feeds)[0]
    for variant in D.cpu_variants_for(fmt, "fp32") + ["untuned"]:
        predictor = D.PaddlePredictor(exports[fmt], "paddle-cpu", "fp32", threads=2, meta=meta, cpu_variant=variant)
        for _ in range(2):
            np.testing.assert_allclose(predictor.run(feeds)[0], reference, rtol=1e-4, atol=1e-5, err_msg=variant)
        assert predictor.plan["cpu_variant"] == variant
    assert not os.path.exists(tmp_path / "__cache__")  # nothing written into the caller's directory
    if fmt == "program":
        assert os.path.isdir(os.path.join(exports[fmt], "_openvino_cache"))


@pytest.mark.skipif(D.cpu_has_bf16(), reason="this CPU has bf16 hardware: auto measures (next test)")
def test_precision_auto_without_bf16_hardware_is_fp32_in_one_line(exports):
    predictor = D.create_predictor(exports["pir"], "paddle-cpu", "auto", threads=1)
    assert predictor.plan["precision"] == "fp32" and predictor.plan["cpu_variant"] == "default"
    assert predictor.plan["notes"][0] == ("cpu plan: fp32 default (this CPU has neither avx512_bf16 nor amx_bf16, so "
                                          "oneDNN would emulate bf16; nothing to measure)")


def test_auto_plan_is_measured_in_workers_once_then_cached(exports, tmp_path, monkeypatch):
    monkeypatch.setenv("PPDLX_DEPLOY_CACHE", str(tmp_path / "cache"))
    files = D.model_files(exports["pir"])
    kwargs = dict(threads=1, batch_size=2, rounds=1, warmup=1, steps=2, features=AMD_AVX2)
    first = D.choose_cpu_plan(exports["pir"], files, "fp32", "auto", **kwargs)
    assert not first["cached"] and set(first["medians_ms"]) == {"paddle-cpu fp32 default", "paddle-cpu fp32 mkl-fc"}
    assert all(ms > 0 for ms in first["medians_ms"].values())
    chosen = min(first["medians_ms"], key=first["medians_ms"].get)
    assert f"paddle-cpu {first['precision']} {first['cpu_variant']}" == chosen
    assert first["line"].startswith(f"cpu plan: {chosen}, median ")
    assert "1 round(s) in separate processes on AMD EPYC (sample)" in first["line"]
    second = D.choose_cpu_plan(exports["pir"], files, "fp32", "auto", **kwargs)
    assert second["cached"] and second["medians_ms"] == first["medians_ms"]
    assert "cached from 1 round(s)" in second["line"]
    assert os.path.isfile(tmp_path / "cache" / "cpu_plans.json")
    # another CPU kind is another decision
    other = D.choose_cpu_plan(exports["pir"], files, "fp32", "default", **dict(kwargs, features=INTEL_BF16))
    assert other["line"] == "cpu plan: fp32 default (the only candidate; nothing to measure)"
    predictor = D.create_predictor(exports["pir"], "paddle-cpu", "fp32", threads=1, batch_size=2, cpu_variant="auto")
    assert predictor.plan["notes"][0].startswith("cpu plan: paddle-cpu fp32 ")
    assert predictor.plan["cpu_variant"] == predictor.plan["cpu_choice"]["cpu_variant"]


def test_int8_plan_passes_the_calibrated_op_list_and_refuses_a_pir_program(tmp_path):
    meta = {"precision": "int8", "quantization": {"onednn_int8_ops": ["fc", "conv2d", "fused_conv2d"]}}
    plan = D.build_plan(meta, _files("program", tmp_path), "paddle-cpu", "int8", threads=2, quantized=True,
                        cpu_flag_set=set(INTEL_BF16["flags"]))
    assert ("enable_onednn_int8", [["conv2d", "fc", "fused_conv2d"]]) in _calls(plan)
    with pytest.raises(D.UnsupportedError, match=r"^--backend paddle-cpu --precision int8: a PIR \(.json\) program"):
        D.build_plan(meta, _files("pir", tmp_path), "paddle-cpu", "int8", threads=2, quantized=True,
                     cpu_flag_set=set(INTEL_BF16["flags"]))


def test_cli_cpu_variant_runs_the_named_settings_or_refuses_in_one_line(exports, tmp_path):
    """deploy/python/infer.py --cpu-variant: a named variant is the plan the predictor runs; a wrong
    name or backend is one line, exit 2 (auto's measuring is tested above through the API)."""
    import json
    import subprocess
    import sys
    infer = os.path.join(os.path.dirname(D.__file__), os.pardir, "infer.py")
    base = [sys.executable, infer, "--model-dir", exports["program"], "--benchmark", "--synthetic",
            "--batch-sizes", "1", "--warmup", "1", "--repeats", "2", "--threads", "1", "--backend", "paddle-cpu"]
    report = tmp_path / "rows.json"
    proc = subprocess.run(base + ["--cpu-variant", "mkl-fc+memory-optim", "--report", str(report)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(report.read_text())["rows"]
    assert [r["cpu_variant"] for r in rows] == ["mkl-fc+memory-optim"] and rows[0]["latency_ms"]["mean"] > 0
    for args, line in ((["--cpu-variant", "fast", "--backend", "paddle-cpu"],
                        "error: --cpu-variant fast: choose auto, or from default, "),
                       (["--cpu-variant", "auto", "--backend", "onnxruntime"],
                        "error: --cpu-variant auto: applies to --backend paddle-cpu only (not onnxruntime); add "
                        "--backend paddle-cpu or drop it")):
        proc = subprocess.run(base[:-2] + args, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(line), proc.stderr[-2000:]


def test_precision_auto_keeps_fp32_for_an_export_whose_verify_missed_bf16(exports):
    """inference.yml verify: with a bf16 case outside the gate -> --precision auto is fp32, saying why,
    on every CPU (nothing is measured); a passed bf16 case or no verify record leaves auto to measure."""
    meta = D.load_meta(exports["program"])
    missed = dict(meta, verify={"cases": [{"backend": "paddle-cpu", "precision": "fp32", "passed": True},
                                          {"backend": "paddle-cpu", "precision": "bf16", "passed": False}]})
    assert D.bf16_failed_verify(missed)
    predictor = D.create_predictor(exports["program"], "paddle-cpu", "auto", threads=1, meta=missed)
    assert predictor.plan["precision"] == "fp32" and predictor.plan["cpu_variant"] == "default"
    assert predictor.plan["notes"][0] == ("cpu plan: fp32 (this export's --verify found bf16 outside its gate: "
                                          "inference.yml verify)")
    passed = dict(meta, verify={"cases": [{"backend": "paddle-cpu", "precision": "bf16", "passed": True}]})
    skipped = dict(meta, verify={"cases": [{"backend": "paddle-cpu", "precision": "bf16", "skipped": "no bf16"}]})
    assert not D.bf16_failed_verify(passed) and not D.bf16_failed_verify(skipped) and not D.bf16_failed_verify(meta)
