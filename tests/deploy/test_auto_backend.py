"""``--backend auto`` (the command line's default) and OpenVINO as a backend: the choice is measured in
worker processes once and reused while its facts hold (counted by the workers themselves, not by time),
a change of CPU flags, threads or runtime versions measures again, a runtime whose outputs disagree with
the export's is never chosen, one whose --verify case failed is not even run, and a runtime that is not
installed is skipped with one line."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.infer import load_deploy_module

D = load_deploy_module()
DEPLOY_PY = os.path.dirname(os.path.dirname(os.path.abspath(D.__file__)))
AMD_AVX2 = {"vendor": "AuthenticAMD", "model_name": "AMD EPYC (sample)", "flags": ["avx2", "fma"]}
QUICK = dict(threads=1, batch_size=2, rounds=1, warmup=1, steps=2, features=AMD_AVX2)
TWO_RUNTIMES = ("paddle-cpu", "onnxruntime")


def _workers(log):
    """The measuring workers that ran, as they logged themselves."""
    if not os.path.isfile(log):
        return []
    with open(log, encoding="utf-8") as f:
        return [json.loads(line)["label"] for line in f]


def test_openvino_runs_the_exports_onnx_and_pdmodel_like_paddle(exports, tmp_path):
    pytest.importorskip("openvino")
    meta = D.load_meta(exports["program"])
    feeds = D.synthetic_feeds(meta, 3)
    reference = D.PaddlePredictor(exports["program"], "paddle-cpu", "fp32", threads=1, meta=meta).run(feeds)[0]
    on_onnx = D.create_predictor(exports["program"], "openvino", threads=1)
    assert on_onnx.plan["graph"] == "onnx" and on_onnx.plan["engine"] == "openvino"
    assert on_onnx.plan["notes"][0].startswith("engine openvino: OpenVINO ")
    np.testing.assert_allclose(on_onnx.run(feeds)[0], reference, rtol=1e-4, atol=1e-5)
    single = D.synthetic_feeds(meta, 1)  # another batch size: compiled for its own shape
    np.testing.assert_allclose(on_onnx.run(single)[0], D.PaddlePredictor(exports["program"], "paddle-cpu", "fp32",
                               threads=1, meta=meta).run(single)[0], rtol=1e-4, atol=1e-5)
    # without the ONNX file OpenVINO's Paddle front end reads the legacy program; the PIR one it cannot read
    legacy = tmp_path / "legacy"
    shutil.copytree(exports["program"], legacy)
    os.remove(legacy / "inference.onnx")
    on_program = D.create_predictor(str(legacy), "openvino", threads=1)
    assert on_program.plan["graph"] == "program"
    np.testing.assert_allclose(on_program.run(feeds)[0], reference, rtol=1e-4, atol=1e-5)
    pir_only = tmp_path / "pir_only"
    shutil.copytree(exports["pir"], pir_only)
    os.remove(pir_only / "inference.onnx")
    with pytest.raises(D.UnsupportedError, match=r"^--backend openvino: .* has neither inference.onnx nor a legacy "
                                                  r"inference.pdmodel .*; re-export with --onnx$"):
        D.create_predictor(str(pir_only), "openvino", threads=1)


def test_a_cached_decision_is_reused_and_a_changed_fact_measures_again(exports, tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    log, cache = str(tmp_path / "workers.jsonl"), str(tmp_path / "plans.json")
    monkeypatch.setenv(D.WORKER_LOG_ENV, log)
    model_dir = exports["pir"]
    meta = D.load_meta(model_dir)
    files = D.model_files(model_dir, meta)
    versions = D.runtime_versions()
    kwargs = dict(QUICK, cache_file=cache, backends=TWO_RUNTIMES, versions=versions)
    first = D.choose_backend(model_dir, meta, files, **kwargs)
    measured = _workers(log)
    assert not first["cached"] and sorted(measured) == ["onnxruntime fp32", "paddle-cpu fp32 default",
                                                        "paddle-cpu fp32 mkl-fc"]
    assert first["chosen"] in measured and first["spec"]["name"] == first["chosen"]
    assert first["line"].startswith(f"backend auto: {first['chosen']}, median ")
    with open(cache, encoding="utf-8") as f:
        stored = f.read()
    second = D.choose_backend(model_dir, meta, files, **kwargs)
    assert second["cached"] and second["chosen"] == first["chosen"] and "; cached from 1 round(s)" in second["line"]
    assert _workers(log) == measured  # no worker ran
    with open(cache, encoding="utf-8") as f:
        assert f.read() == stored
    # each fact is part of the key: another CPU flag, thread count or runtime version finds no decision
    facts = next(iter(json.loads(stored).values()))["facts"]
    assert facts["threads"] == 1 and facts["flags"] == sorted(AMD_AVX2["flags"]) and facts["versions"] == versions
    assert D.cached_decision(cache, facts) is not None
    for key, value in (("flags", sorted(AMD_AVX2["flags"] + ["avx512f"])), ("threads", 2),
                       ("versions", dict(facts["versions"], onnxruntime="0.0.1")), ("batch_size", 8)):
        assert D.cached_decision(cache, dict(facts, **{key: value})) is None, key
    # and measuring again is what a changed fact does
    third = D.choose_backend(model_dir, meta, files, **dict(kwargs, versions=dict(versions, openvino="0.0.1")))
    assert not third["cached"] and len(_workers(log)) == 2 * len(measured)


def test_a_runtime_whose_outputs_disagree_is_never_chosen(exports, tmp_path, monkeypatch):
    """The ONNX file's classifier weights perturbed: onnxruntime (and OpenVINO, which reads the same file)
    run and are timed, but their outputs differ from the program's beyond the export check's tolerance."""
    pytest.importorskip("onnxruntime")
    import onnx
    from onnx import numpy_helper
    model_dir = tmp_path / "perturbed"
    shutil.copytree(exports["pir"], model_dir)
    model = onnx.load(str(model_dir / "inference.onnx"))
    bias = [t for t in model.graph.initializer if numpy_helper.to_array(t).shape == (3,)][-1]
    values = numpy_helper.to_array(bias).copy() + np.float32(0.05)
    bias.CopyFrom(numpy_helper.from_array(values, bias.name))
    onnx.save(model, str(model_dir / "inference.onnx"))
    log = str(tmp_path / "workers.jsonl")
    monkeypatch.setenv(D.WORKER_LOG_ENV, log)
    meta = D.load_meta(str(model_dir))
    decision = D.choose_backend(str(model_dir), meta, D.model_files(str(model_dir), meta),
                                **dict(QUICK, cache_file=str(tmp_path / "plans.json")))
    onnx_runtimes = [name for name in ("onnxruntime fp32", "openvino fp32") if name in _workers(log)]
    assert "onnxruntime fp32" in onnx_runtimes
    assert decision["chosen"].startswith("paddle-cpu fp32")
    for name in onnx_runtimes:
        assert decision["rejected"][name].startswith("output 0 differs from paddle-cpu fp32 default's by 0.05 > ")
        assert f"{name} (output 0 differs" in decision["line"]


def test_a_runtime_that_failed_verify_is_not_run(exports, tmp_path, monkeypatch):
    """inference.yml verify: records onnxruntime outside the gate: auto leaves it out before measuring."""
    pytest.importorskip("onnxruntime")
    log = str(tmp_path / "workers.jsonl")
    monkeypatch.setenv(D.WORKER_LOG_ENV, log)
    meta = dict(D.load_meta(exports["pir"]), verify={"cases": [
        {"backend": "paddle-cpu", "precision": "fp32", "passed": True},
        {"backend": "onnxruntime", "precision": "fp32", "passed": False, "cause": "numerics: 60.0% agree"}]})
    decision = D.choose_backend(exports["pir"], meta, D.model_files(exports["pir"], meta),
                                **dict(QUICK, cache_file=str(tmp_path / "plans.json"), backends=TWO_RUNTIMES))
    assert "onnxruntime fp32" not in _workers(log) and decision["chosen"].startswith("paddle-cpu fp32")
    assert decision["skipped"] == ["onnxruntime fp32: failed this export's --verify (numerics: 60.0% agree)"]


def test_a_qdq_graph_that_failed_verify_is_no_candidate(exports):
    """A QAT detector's export: its float program and its QDQ ONNX file; --verify failed onnxruntime int8,
    so auto measures only what passed, and asking for int8 alone says why nothing is left."""
    pytest.importorskip("onnxruntime")
    model_dir = exports["pir"]
    meta = dict(D.load_meta(model_dir), quantization={"onnx": "qdq"}, verify={"cases": [
        {"backend": "paddle-cpu", "precision": "fp32", "passed": True},
        {"backend": "onnxruntime", "precision": "int8", "passed": False, "cause": "AP 0.15 vs 0.17"}]})
    files = D.model_files(model_dir, meta)
    candidates, skipped = D.runtime_candidates(model_dir, meta, files, "auto", AMD_AVX2, backends=TWO_RUNTIMES)
    assert [(c["backend"], c["precision"]) for c in candidates] == [("paddle-cpu", "fp32")] * len(candidates)
    assert "onnxruntime int8: failed this export's --verify (AP 0.15 vs 0.17)" in skipped
    with pytest.raises(D.UnsupportedError, match=r"no CPU runtime can run this export here \(onnxruntime int8: "
                                                 r"failed this export's --verify"):
        D.runtime_candidates(model_dir, meta, files, "int8", AMD_AVX2, backends=TWO_RUNTIMES)


# Run first in the subprocess: onnxruntime and openvino cannot be imported, as on a host without them.
WITHOUT_RUNTIMES = r"""
import importlib.abc, sys, runpy

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("onnxruntime", "openvino"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None

sys.meta_path.insert(0, Absent())
sys.argv = [INFER] + ARGS
runpy.run_path(INFER, run_name="__main__")
"""


def test_the_default_backend_skips_a_missing_runtime_in_one_line(exports, tmp_path):
    infer = os.path.join(DEPLOY_PY, "infer.py")
    args = ["--model-dir", exports["pir"], "--benchmark", "--synthetic", "--batch-sizes", "1", "--warmup", "1",
            "--repeats", "2", "--threads", "1"]
    code = "".join(f"{name} = {value!r}\n" for name, value in (("INFER", infer), ("ARGS", args))) + WITHOUT_RUNTIMES
    env = dict(os.environ, PPDLX_DEPLOY_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    notes = [line for line in proc.stderr.splitlines() if line.startswith("# backend auto: paddle-cpu fp32 ")]
    assert len(notes) == 1, proc.stderr[-3000:]
    assert ("; skipped: onnxruntime: not installed (pip install onnxruntime), openvino: not installed (pip install "
            "openvino); ") in notes[0]
    assert "engine onednn" in proc.stderr


def _values(*arrays):
    return [{"shape": list(a.shape), "values": np.asarray(a, np.float64).ravel().tolist()} for a in arrays]


def test_detections_agree_as_sets_and_a_moved_box_does_not():
    """Tied scores leave NMS free to keep tied boxes in either order: the same detections in another order
    agree; a box moved by a pixel, a changed class or a missing detection above the cut do not."""
    from ppdlx_deploy.agreement import disagreement
    meta = {"outputs": [{"role": r} for r in ("boxes", "scores", "classes", "count")]}
    boxes = np.asarray([[[10, 10, 50, 50], [60, 60, 90, 90], [5, 70, 40, 99], [0, 0, 0, 0]]], np.float32)
    scores = np.asarray([[0.9, 0.5, 0.5, 0.0]], np.float32)
    classes = np.asarray([[1, 2, 3, -1]], np.float32)
    count = np.asarray([3], np.float32)
    reference = _values(boxes, scores, classes, count)
    swapped = [0, 2, 1, 3]
    assert disagreement(meta, reference, _values(boxes[:, swapped], scores[:, swapped], classes[:, swapped], count),
                        "ref") is None
    moved = boxes.copy()
    moved[0, 1, 0] += 1.0
    assert disagreement(meta, reference, _values(moved, scores, classes, count), "ref").startswith(
        "detections differ from ref's: image 0: detection (class 2, score 0.5) has no counterpart (boxes within ")
    relabelled = classes.copy()
    relabelled[0, 0] = 7
    assert "detection (class 1, score 0.9) has no counterpart" in disagreement(
        meta, reference, _values(boxes, scores, relabelled, count), "ref")
    fewer = _values(boxes, scores, classes, np.asarray([2], np.float32))
    assert "detection (class 3, score 0.5) has no counterpart" in disagreement(meta, reference, fewer, "ref")
    # a full output (count = its size) cut among tied scores: which tied box made the cut is free
    full = _values(boxes[:, :2], scores[:, :2], classes[:, :2], np.asarray([2], np.float32))
    other_tie = _values(boxes[:, [0, 2]], scores[:, [0, 2]], classes[:, [0, 2]], np.asarray([2], np.float32))
    assert disagreement(meta, full, other_tie, "ref") is None
