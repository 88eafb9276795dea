"""Detection engine: a short run on the synthetic shapes set lowers the loss and writes what it should;
evaluate() of the checkpoint reproduces the run's eval; sharded eval counts every image once."""
import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from ppdlx.config import load_config
from ppdlx.data.synthetic_coco import make_synthetic_coco
from ppdlx.errors import DataError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, "configs", "demo", "efficientdet_demo.yaml")


def _overrides(root, out, *extra):
    return [f"data.root={root}", f"global.output_dir={out}", "data.coco.image_size=64", "data.workers=0",
            "detection.pre_nms_top_k=300", "global.log_interval=1", *extra]


def test_short_training_lowers_the_loss_and_eval_reproduces(short_detector_run, tmp_path):
    """The session's short run (conftest ``short_detector_run``: 3 epochs of 4 steps, lr 0.1, no EMA)."""
    from ppdlx.engine.run import evaluate
    out, report = short_detector_run["run"], short_detector_run["report"]
    lines = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]
    losses = [x["loss"] for x in lines if x["kind"] == "train"]
    assert len(losses) == 12
    assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:2]), losses
    assert report["images"] == 5 and report["epochs"] == 3
    assert set(report) >= {"AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "seconds"}
    assert "top1" not in report
    for name in ("latest/model.pdparams", "best/model.pdparams", "config.yaml", "classes.json",
                 "detections_val.json"):
        assert os.path.isfile(os.path.join(out, name)), name
    classes = json.load(open(os.path.join(out, "classes.json")))
    assert classes == {"category_ids": [1, 3, 7], "names": ["circle", "square", "triangle"]}
    dets = json.load(open(os.path.join(out, "detections_val.json")))
    assert dets and {d["category_id"] for d in dets} <= {1, 3, 7}
    assert {d["image_id"] for d in dets} <= {1, 2, 3, 4, 5}
    # evaluate() of the saved weights (no EMA) gives the run's final numbers
    ev = evaluate(load_config(DEMO, _overrides(short_detector_run["root"], str(tmp_path / "ev"),
                                               f"model.weights={out}/latest")))
    assert set(ev) == {"AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl",
                       "images", "seconds"}
    assert ev["images"] == 5
    for k in ("AP", "AP50", "AR100"):
        assert abs(ev[k] - report[k]) < 1e-9


def test_num_classes_must_match_the_dataset(small_shapes, tmp_path):
    from ppdlx.engine.run import train
    cfg = load_config(DEMO, _overrides(small_shapes, str(tmp_path), "model.num_classes=91"))
    # the start-of-training data check (ppdlx.analysis.check_before_training) finds it before the loader does
    with pytest.raises(DataError) as err:
        train(cfg)
    msg = str(err.value)
    assert "model.num_classes=91" in msg and "3 categories" in msg and "model.num_classes=3" in msg


def test_weight_decay_on_conv_kernels_only():
    from ppdlx.models import MODELS
    from ppdlx.optim import param_groups
    model = MODELS.build("efficientdet_d0", num_classes=3, image_size=64)
    decay, no_decay = param_groups(model, 4e-5, "conv_kernels")
    assert decay["weight_decay"] == 4e-5 and no_decay["weight_decay"] == 0.0
    assert all(len(p.shape) == 4 for p in decay["params"])
    assert all(len(p.shape) != 4 for p in no_decay["params"])
    names = {id(p): n for n, p in model.named_parameters()}
    assert any("fusion_weights" in names[id(p)] for p in no_decay["params"])
    n_conv = sum(1 for layer in model.sublayers() if isinstance(layer, paddle.nn.Conv2D))
    assert len(decay["params"]) == n_conv
    # timm's rule (the default) decays every non-1-D parameter
    d2, _ = param_groups(model, 4e-5)
    assert len(d2["params"]) == n_conv


def _save_random_weights(path, image_size=64):
    from ppdlx.models import MODELS
    paddle.seed(3)
    model = MODELS.build("efficientdet_d0", num_classes=3, image_size=image_size)
    paddle.save(model.state_dict(), path + ".pdparams")


def test_sharded_eval_counts_every_image_once(small_shapes, tmp_path):
    """Two ranks simulated by (rank, world) args: disjoint shards whose union is the val set, and the
    merged detections equal a single-rank run."""
    from ppdlx.data.coco import build_coco_loader
    from ppdlx.evaluation.coco import coco_evaluate, merge_shards
    from ppdlx.tasks.detection import build_detection_model, build_evaluator
    from ppdlx.tasks.preprocess import resolve_preprocessing
    cfg = resolve_preprocessing(load_config(DEMO, _overrides(small_shapes, str(tmp_path), "eval.batch_size=2",
                                                             "detection.save_results=false")))
    _save_random_weights(str(tmp_path / "w"))
    model = build_detection_model(cfg, 3)
    model.set_state_dict(paddle.load(str(tmp_path / "w.pdparams")))
    model.eval()
    runs = []
    for rank, world in ((0, 1), (0, 2), (1, 2)):
        loader = build_coco_loader(cfg, "val", rank, world, batch_size=2)
        runs.append(build_evaluator(cfg, model, loader).predict(model))
    single, shard0, shard1 = runs
    assert sorted(single[1]) == [1, 2, 3, 4, 5]
    assert set(shard0[1]).isdisjoint(shard1[1]) and len(shard0[1]) + len(shard1[1]) == 5
    merged, ids = merge_shards([shard0, shard1])
    assert ids == [1, 2, 3, 4, 5] and len(merged) == len(single[0])
    key = lambda d: (d["image_id"], d["category_id"], d["score"], tuple(d["bbox"]))  # noqa: E731
    assert sorted(map(key, merged)) == sorted(map(key, single[0]))
    gt = build_coco_loader(cfg, "val").coco_gt
    assert coco_evaluate(gt, merged, ids) == coco_evaluate(gt, single[0], single[1])


def test_two_process_eval_gathers_every_image_once(small_shapes, tmp_path):
    """A real 2-process launch (gloo on CPU): rank 0 gathers both shards; the results JSON equals a
    single-process run's."""
    from ppdlx.engine.run import evaluate
    _save_random_weights(str(tmp_path / "w"))
    # precise BN off: its statistics come from precise_bn_batches per rank, so they depend on the world size
    overrides = _overrides(small_shapes, str(tmp_path / "d"), f"model.weights={tmp_path}/w", "eval.batch_size=2",
                           "detection.precise_bn_batches=0")
    proc = subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir",
                           str(tmp_path / "log"), os.path.join(ROOT, "tools", "eval.py"), "-c", DEMO, "--report",
                           str(tmp_path / "d.json"), "-o", *overrides],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    logs = proc.stderr + "".join(open(tmp_path / "log" / f).read() for f in os.listdir(tmp_path / "log"))
    assert proc.returncode == 0, logs[-3000:]
    dist_report = json.loads((tmp_path / "d.json").read_text())
    dist_dets = json.loads((tmp_path / "d" / "detections_val.json").read_text())
    single_report = evaluate(load_config(DEMO, _overrides(small_shapes, str(tmp_path / "s"),
                                                          f"model.weights={tmp_path}/w", "eval.batch_size=2",
                                                          "detection.precise_bn_batches=0")))
    single_dets = json.loads((tmp_path / "s" / "detections_val.json").read_text())
    assert dist_report["images"] == single_report["images"] == 5
    key = lambda d: (d["image_id"], d["category_id"], round(d["score"], 4), tuple(round(v, 1) for v in d["bbox"]))  # noqa
    assert len(dist_dets) == len(single_dets)
    assert sorted(map(key, dist_dets)) == sorted(map(key, single_dets))
    assert abs(dist_report["AP"] - single_report["AP"]) < 1e-6


def test_freeze_small_bn_keeps_fixed_statistics():
    from ppdlx.evaluation.precise_bn import recompute_bn_stats
    from ppdlx.tasks.detection import freeze_small_bn
    from ppdlx.models import MODELS
    paddle.seed(0)
    model = MODELS.build("efficientdet_d0", num_classes=3, image_size=64)
    # at 64 px: P5 2x2, P6/P7 1x1 -> the BiFPN nodes, resamplers and per-level head BNs there
    assert freeze_small_bn(model, 64, 4) == 50
    frozen = [l for l in model.sublayers() if getattr(l, "_use_global_stats", False)]
    model.train()
    model(paddle.randn([2, 3, 64, 64]) * 3 + 1)
    recompute_bn_stats(model, [(paddle.randn([2, 3, 64, 64]) * 3 + 1,)], 1)
    assert all(float(l._mean.abs().max()) == 0 and float((l._variance - 1).abs().max()) == 0 for l in frozen)
    assert float(model.backbone.stem.bn._mean.abs().max()) > 0  # the others still learn statistics


def test_precise_bn_batches_are_training_images_through_the_eval_transform(small_shapes, tmp_path):
    from ppdlx.data.coco import build_coco_loader
    from ppdlx.tasks.detection import build_precise_bn_loader
    from ppdlx.tasks.preprocess import resolve_preprocessing
    cfg = resolve_preprocessing(load_config(DEMO, _overrides(small_shapes, tmp_path, "eval.batch_size=6")))
    loader = build_precise_bn_loader(cfg, 0, 1, None)
    first = [b[0].numpy() for b in loader]
    again = [b[0].numpy() for b in loader]
    assert [len(x) for x in first] == [6, 6, 4]  # the 16 training images, each once
    assert all(np.array_equal(a, b) for a, b in zip(first, again))  # no augmentation
    val = build_coco_loader(cfg, "val", batch_size=6)
    assert val.num_images == 5 and loader.num_images == 16


def test_an_absent_image_is_read_and_reported_once_when_training_starts(tmp_path, ppdlx_caplog):
    # Before: the start-of-training check and the loaders each built their own index of the json: the
    # absent file was named in three lines (the check's and one per loader).
    from ppdlx.engine.run import build_training
    root = str(tmp_path / "shapes")
    paths = make_synthetic_coco(root, num_train=8, num_val=4, seed=1)
    gone = json.load(open(paths["train"]))["images"][3]["file_name"]
    os.remove(os.path.join(root, "train", gone))
    trainer = build_training(load_config(DEMO, _overrides(root, str(tmp_path / "out"), "train.epochs=1", "data.batch_size=2")))
    assert trainer.train_loader.num_images == 7
    named = [r.getMessage() for r in ppdlx_caplog.records if gone in r.getMessage()]
    assert len(named) == 1 and "1 invalid annotation/image" in named[0], named
