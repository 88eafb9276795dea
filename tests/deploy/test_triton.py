"""Serving with Triton (deploy/triton): a repository made from a demo ResNet50 export and a demo
EfficientDet-D0 export (random weights, small inputs) is served by the tritonserver of the
nvidia-pytriton wheel on loopback ports, started and stopped here. Real images (paddlelabel's photos,
scikit-learn digits, a PNG) go in over HTTP and gRPC; the answers equal deploy/python/infer.py's
pipeline on the same files; bad requests get error responses while the server keeps serving;
concurrent clients are batched and all answered right. The ONNX Runtime + TensorRT ensemble cannot
run here (no onnxruntime backend in the wheel): its config text is parsed with Triton's own
model-config schema and checked against the ONNX graph."""
import glob
import importlib.util
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from PIL import Image

from benchmarks.infer import load_deploy_module
from ppdlx.export import export_model
from tests.conftest import make_digits_tree
from tests.deploy.test_infer import real_photos
from tests.export.test_export import small_cfg, small_model

D = load_deploy_module()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRITON_DIR = os.path.join(ROOT, "deploy", "triton")
if TRITON_DIR not in sys.path:
    sys.path.insert(0, TRITON_DIR)

from ppdlx_triton import client as triton_client  # noqa: E402
from ppdlx_triton.repository import make_repository  # noqa: E402
from ppdlx_triton.server import TritonServer  # noqa: E402

DET_THRESHOLD = 0.2
MISSING = [name for name, module in (("nvidia-pytriton (pip install --no-deps nvidia-pytriton==0.7.0)", "pytriton"),
                                     ("tritonclient (pip install 'tritonclient[http,grpc]')", "tritonclient"))
           if importlib.util.find_spec(module) is None]
needs_server = pytest.mark.skipif(bool(MISSING), reason=f"{' and '.join(MISSING)} not installed")


@pytest.fixture(scope="module")
def exports(random_detector_export, tmp_path_factory):
    """The two exports, with ONNX files (the ensemble configs read them): ResNet50 at 32 px with its
    classifier scaled so logits are O(1), and EfficientDet-D0 at 64 px with its class head's biases
    spread so scores differ (conftest ``random_detector_export``: an untrained head scores every anchor 0.01)."""
    root = tmp_path_factory.mktemp("triton_exports")
    cfg = small_cfg("resnet50", **{"model.num_classes": 4, "data.transforms.crop_size": 32,
                                   "data.transforms.resize_short": 36})
    export_model(cfg, output_dir=str(root / "rn50"), model=small_model(cfg), onnx=True, check=False,
                 labels=["zero", "one", "two", "three"])
    return {"rn50": str(root / "rn50"), "det": str(random_detector_export["dir"])}


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Photos (JPEG, and one as PNG) when paddlelabel is installed, and digits (32 px JPEG) always."""
    root = tmp_path_factory.mktemp("triton_images")
    paths = real_photos()[:3]
    if paths:
        with Image.open(paths[0]) as img:
            img.convert("RGB").resize((160, 120)).save(root / "photo.png")
        paths.append(str(root / "photo.png"))
    digits = make_digits_tree(root / "digits", per_class=1, classes=4)
    paths += sorted(glob.glob(os.path.join(digits, "*", "*", "*.jpg")))[:3]
    return paths


@pytest.fixture(scope="module")
def repository(exports, tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("triton_repo"))
    make_repository(exports["rn50"], repo, name="rn50", max_batch_size=4, topk=3, threads=1)
    make_repository(exports["det"], repo, name="det", max_batch_size=4, score_threshold=DET_THRESHOLD, threads=1)
    # the ONNX route's ensemble, with onnxruntime on CPU in the network step's place (no ONNX Runtime backend here)
    for model, options in (("rn50", {"topk": 3}), ("det", {"score_threshold": DET_THRESHOLD})):
        make_repository(exports[model], repo, name=f"{model}_onnx", backend="onnxruntime", network_runtime="python",
                        max_batch_size=4, threads=1, **options)
    # the Python-backend model with another ppdlx_deploy runtime: onnxruntime reads the copied ONNX file
    make_repository(exports["rn50"], repo, name="rn50_ort", predictor_backend="onnxruntime", max_batch_size=4, topk=3,
                    threads=1)
    return repo


@pytest.fixture(scope="module")
def server(repository):
    if MISSING:
        pytest.skip(f"{' and '.join(MISSING)} not installed")
    with TritonServer(repository, start_timeout=240) as running:
        yield running
        assert running.alive(), running.log_tail()


@pytest.fixture(scope="module")
def expected(exports, images):
    """deploy/python/infer.py's answers: ppdlx_deploy's pipeline on the same files, one at a time."""
    answers = {}
    for model, options in (("rn50", {"topk": 3}), ("det", {"score_threshold": DET_THRESHOLD})):
        for backend, name in (("paddle-cpu", model), ("onnxruntime", f"{model}_onnx")):
            pipeline = D.Pipeline.open(exports[model], backend, "fp32", threads=1)
            answers[name] = [result for _, result in pipeline.predict(images, batch_size=1, **options)]
    assert sum(len(r) for r in answers["det"]) > 0, "the test needs images with detections"
    return answers


def assert_same_classes(served, expected):
    assert len(served) == len(expected)
    for got, ref in zip(served, expected):
        assert [(c, label) for c, label, _ in got] == [(c, label) for c, label, _ in ref]
        assert np.abs(np.array([s for *_, s in got]) - np.array([s for *_, s in ref])).max() <= 1e-5


def assert_same_detections(served, expected):
    assert len(served) == len(expected)
    for got, ref in zip(served, expected):
        assert [(c, label) for _, _, c, label in got] == [(c, label) for _, _, c, label in ref]
        if ref:
            assert np.abs(np.array([s for _, s, _, _ in got]) - np.array([s for _, s, _, _ in ref])).max() <= 1e-5
            assert np.abs(np.array([b for b, *_ in got]) - np.array([b for b, *_ in ref])).max() <= 1e-2


@needs_server
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_served_answers_equal_the_infer_pipeline(server, expected, images, protocol):
    url = server.http_url if protocol == "http" else server.grpc_url
    files = triton_client.read_files(images)
    classifier = triton_client.ServedModel(url, protocol, "rn50")
    assert_same_classes([classifier.predict([f])[0] for f in files], expected["rn50"])
    # several files of different lengths in one request (zero-padded rows)
    assert_same_classes(classifier.predict(files[:3]), expected["rn50"][:3])
    # Triton's classification extension names the classes from labels.txt
    named = triton_client.parse_classification(classifier.infer_arrays(files[:1], class_count=2)["probabilities"])
    assert [(c, label) for c, label, _ in named] == [(c, label) for c, label, _ in expected["rn50"][0][:2]]
    detector = triton_client.ServedModel(url, protocol, "det")
    assert_same_detections([detector.predict([f])[0] for f in files], expected["det"])
    assert_same_detections(detector.predict(files[:3]), expected["det"][:3])
    assert detector.labels == ["circle", "square", "triangle"]


@needs_server
def test_the_onnx_ensemble_answers_like_the_onnxruntime_pipeline(server, expected, images):
    """The ONNX route's ensemble (pre-processing, the network, NMS/top-k) run by Triton's ensemble scheduler,
    with onnxruntime on CPU as its network step, against ppdlx_deploy's onnxruntime pipeline."""
    files = triton_client.read_files(images)
    classifier = triton_client.ServedModel(server.grpc_url, "grpc", "rn50_onnx")
    assert_same_classes([classifier.predict([f])[0] for f in files], expected["rn50_onnx"])
    named = triton_client.parse_classification(classifier.infer_arrays(files[:1], class_count=2)["probabilities"])
    assert [(c, label) for c, label, _ in named] == [(c, label) for c, label, _ in expected["rn50_onnx"][0][:2]]
    detector = triton_client.ServedModel(server.http_url, "http", "det_onnx")
    assert_same_detections([detector.predict([f])[0] for f in files], expected["det_onnx"])
    assert_same_detections(detector.predict(files[:3]), expected["det_onnx"][:3])


@needs_server
def test_the_python_model_serves_with_the_runtime_it_names(server, expected, images):
    """``--predictor-backend onnxruntime``: the Python-backend model opens ppdlx_deploy's onnxruntime
    predictor on the ONNX file copied into its export, and answers like the onnxruntime pipeline."""
    files = triton_client.read_files(images)
    served = triton_client.ServedModel(server.http_url, "http", "rn50_ort")
    assert_same_classes([served.predict([f])[0] for f in files], expected["rn50_onnx"])
    assert_same_classes(served.predict(files[:3]), expected["rn50_onnx"][:3])


@needs_server
def test_bad_requests_get_error_responses_and_the_server_keeps_serving(server, expected, images):
    import tritonclient.grpc as grpc
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException
    files = triton_client.read_files(images[:1])
    client = http.InferenceServerClient(server.http_url)

    def send(model, array, datatype="UINT8"):
        tensor = http.InferInput("image_bytes", list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        return client.infer(model, [tensor])

    rows = triton_client.encode_files(files)
    with pytest.raises(InferenceServerException, match="image_bytes"):
        send("rn50", rows.reshape(1, 1, -1))  # a 3-d tensor: wrong shape
    with pytest.raises(InferenceServerException, match="FP32|UINT8|data type|datatype"):
        send("rn50", rows.astype(np.float32), "FP32")
    with pytest.raises(InferenceServerException, match="cannot read image"):
        send("rn50", np.frombuffer(b"\xff\xd8\xff\xe0 not a JPEG after all", np.uint8)[None])
    truncated = rows[:, :rows.shape[1] // 3]
    with pytest.raises(InferenceServerException, match="cannot read image"):
        send("det", truncated)
    with pytest.raises(InferenceServerException, match="unknown model|not found"):
        send("no_such_model", rows)
    with pytest.raises(InferenceServerException, match="unknown model|not found"):
        grpc.InferenceServerClient(server.grpc_url).get_model_metadata("no_such_model")
    # and after all that the same model still answers right
    served = triton_client.ServedModel(server.http_url, "http", "rn50")
    assert_same_classes(served.predict(files), expected["rn50"][:1])
    assert server.alive()


@needs_server
def test_concurrent_clients_are_batched_and_all_answered_right(server, expected, images):
    import tritonclient.http as http
    files = triton_client.read_files(images)
    jobs = [(i % len(files)) for i in range(16)]
    answers, errors = [None] * len(jobs), []
    start = threading.Barrier(8)
    before = http.InferenceServerClient(server.http_url).get_inference_statistics("rn50")["model_stats"][0]

    def worker(worker_id):
        served = triton_client.ServedModel(server.grpc_url if worker_id % 2 else server.http_url,
                                           "grpc" if worker_id % 2 else "http", "rn50")
        start.wait()
        for j in range(worker_id, len(jobs), 8):
            try:
                answers[j] = served.predict([files[jobs[j]]])[0]
            except Exception as err:  # noqa: BLE001  (collected and reported below)
                errors.append(err)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and all(a is not None for a in answers), errors
    assert_same_classes(answers, [expected["rn50"][j] for j in jobs])
    after = http.InferenceServerClient(server.http_url).get_inference_statistics("rn50")["model_stats"][0]
    images_run = int(after["inference_count"]) - int(before["inference_count"])
    batches_run = int(after["execution_count"]) - int(before["execution_count"])
    assert images_run == len(jobs) and batches_run < images_run  # the dynamic batcher grouped requests


def parsed_config(path):
    """A config.pbtxt read with Triton's own model-config schema (tritonclient ships it)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2
    with open(path, encoding="utf-8") as f:
        return text_format.Parse(f.read(), model_config_pb2.ModelConfig())


def onnx_signature(path):
    import onnx
    from onnx import TensorProto
    graph = onnx.load(path).graph
    names = {TensorProto.FLOAT: "TYPE_FP32", TensorProto.INT64: "TYPE_INT64", TensorProto.INT32: "TYPE_INT32"}

    def describe(values):
        return {v.name: (names[v.type.tensor_type.elem_type],
                         [d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim][1:])
                for v in values}
    return describe(graph.input), describe(graph.output)


def tensors(config_tensors):
    from tritonclient.grpc import model_config_pb2
    return {t.name: (model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in config_tensors}


def dims_match(config_dims, graph_dims):
    return len(config_dims) == len(graph_dims) and all(c == -1 or c == g for c, g in zip(config_dims, graph_dims))


@pytest.mark.skipif(importlib.util.find_spec("tritonclient") is None, reason="tritonclient not installed")
@pytest.mark.parametrize("model", ["rn50", "det"])
def test_onnx_ensemble_configs_follow_the_onnx_graph(exports, tmp_path, model):
    repo = str(tmp_path / "repo")
    written = make_repository(exports[model], repo, name=model, backend="onnxruntime", precision="fp16",
                              max_batch_size=16, preferred_batch_sizes=[8, 16], instances=2)
    assert written == [f"{model}_preprocess", f"{model}_network", f"{model}_postprocess", model]
    configs = {name: parsed_config(os.path.join(repo, name, "config.pbtxt")) for name in written}
    net = configs[f"{model}_network"]
    assert net.backend == "onnxruntime" and net.max_batch_size == 16
    assert list(net.dynamic_batching.preferred_batch_size) == [8, 16]
    assert [(g.kind, g.count) for g in net.instance_group] == [(net.instance_group[0].KIND_GPU, 2)]
    graph_inputs, graph_outputs = onnx_signature(os.path.join(repo, f"{model}_network", "1", "model.onnx"))
    for declared, graph in ((tensors(net.input), graph_inputs), (tensors(net.output), graph_outputs)):
        assert declared.keys() == graph.keys()
        for name, (dtype, dims) in declared.items():
            assert dtype == graph[name][0] and dims_match(dims, graph[name][1]), (name, dims, graph[name])
    (trt,) = net.optimization.execution_accelerators.gpu_execution_accelerator
    meta = D.load_meta(exports[model])
    size = "x".join(str(d) for d in meta["inputs"][0]["shape"][1:])
    assert trt.name == "tensorrt" and dict(trt.parameters) == {
        "precision_mode": "FP16", "max_workspace_size_bytes": str(meta["tensorrt"]["workspace_size_bytes"]),
        "trt_engine_cache_enable": "1", "trt_engine_cache_path": f"/tmp/ppdlx_trt_cache/{model}",
        "trt_profile_min_shapes": f"image:1x{size}", "trt_profile_opt_shapes": f"image:16x{size}",
        "trt_profile_max_shapes": f"image:16x{size}"}
    # every tensor a step reads is the ensemble's input or an earlier step's output, with the same type
    ensemble = configs[model]
    assert ensemble.platform == "ensemble"
    available = tensors(ensemble.input)
    for step in ensemble.ensemble_scheduling.step:
        composing = configs[step.model_name]
        step_inputs, step_outputs = tensors(composing.input), tensors(composing.output)
        assert set(step.input_map) == set(step_inputs)
        for key, tensor in step.input_map.items():
            assert available[tensor] == step_inputs[key], (step.model_name, key)
        available.update({tensor: step_outputs[key] for key, tensor in step.output_map.items()})
    assert {name: available[name] for name in tensors(ensemble.output)} == tensors(ensemble.output)
    python_steps = [configs[f"{model}_preprocess"], configs[f"{model}_postprocess"]]
    assert [dict((k, v.string_value) for k, v in c.parameters.items())["role"] for c in python_steps] == \
        ["preprocess", "postprocess"]


@pytest.mark.skipif(importlib.util.find_spec("tritonclient") is None, reason="tritonclient not installed")
def test_python_model_config_and_files(exports, repository):
    config = parsed_config(os.path.join(repository, "rn50", "config.pbtxt"))
    assert config.backend == "python" and config.max_batch_size == 4
    assert tensors(config.input) == {"image_bytes": ("TYPE_UINT8", [-1])} and config.input[0].allow_ragged_batch
    assert tensors(config.output) == {"class_ids": ("TYPE_INT64", [3]), "scores": ("TYPE_FP32", [3]),
                                      "probabilities": ("TYPE_FP32", [4])}
    parameters = {k: v.string_value for k, v in config.parameters.items()}
    assert parameters["backend"] == "paddle-cpu" and parameters["threads"] == "1" and parameters["topk"] == "3"
    with open(os.path.join(repository, "rn50", "labels.txt"), encoding="utf-8") as f:
        assert f.read().split() == ["zero", "one", "two", "three"]
    version = os.path.join(repository, "rn50", "1")
    assert sorted(os.listdir(os.path.join(version, "export"))) == ["inference.json", "inference.pdiparams",
                                                                     "inference.yml"]
    assert os.path.isfile(os.path.join(version, "ppdlx_deploy", "pipeline.py"))
    assert os.path.isfile(os.path.join(version, "ppdlx_triton", "serving.py"))
    onnx_reader = parsed_config(os.path.join(repository, "rn50_ort", "config.pbtxt"))
    assert onnx_reader.parameters["backend"].string_value == "onnxruntime"
    assert onnx_reader.instance_group[0].kind == onnx_reader.instance_group[0].KIND_CPU
    assert "inference.onnx" in os.listdir(os.path.join(repository, "rn50_ort", "1", "export"))


def test_make_repo_refusals_are_one_line(exports, tmp_path):
    tool = os.path.join(TRITON_DIR, "make_repo.py")

    def run(*args):
        proc = subprocess.run([sys.executable, tool, *args], capture_output=True, text=True, timeout=120)
        return proc.returncode, proc.stderr.strip().splitlines()

    repo = str(tmp_path / "repo")
    assert run("--model-dir", exports["rn50"], "--out", repo, "--name", "m")[0] == 0
    code, lines = run("--model-dir", exports["rn50"], "--out", repo, "--name", "m")
    assert code == 2 and len(lines) == 1 and "exists; pass --force" in lines[0]
    code, lines = run("--model-dir", str(tmp_path), "--out", repo)
    assert code == 2 and len(lines) == 1 and "no inference.yml" in lines[0]
    code, lines = run("--model-dir", exports["rn50"], "--out", repo, "--name", "q", "--backend", "onnxruntime",
                      "--precision", "int8")
    assert code == 2 and len(lines) == 1 and "--int8-calibration-table" in lines[0]
    code, lines = run("--model-dir", exports["rn50"], "--out", repo, "--name", "z", "--max-batch-size", "0")
    assert code == 2 and len(lines) == 1 and "--max-batch-size 0" in lines[0]


@pytest.mark.parametrize("option,value,message", [
    ("--concurrency", "0,2", "--concurrency 0,2: give positive integers"),
    ("--requests", "4", "--requests 4: at least the largest concurrency (16)"),
    ("--instances", "0", "--instances 0: must be 1 or more")])
def test_serve_benchmark_refuses_counts_that_measure_nothing_in_one_line(option, value, message):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "benchmark.py"), "serve", "-c",
                           os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml"), option, value],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr[-2000:]


def test_deploy_triton_runs_without_ppdlx():
    """deploy/ runs without ppdlx: no module of deploy/triton imports it (optional packages are imported
    inside functions: tritonclient in the client, triton_python_backend_utils only inside Triton)."""
    import ast
    offenders = []
    for path in glob.glob(os.path.join(TRITON_DIR, "**", "*.py"), recursive=True):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path}: {n}" for n in names if n == "ppdlx" or n.startswith("ppdlx.")]
    assert glob.glob(os.path.join(TRITON_DIR, "ppdlx_triton", "*.py")) and not offenders, offenders
