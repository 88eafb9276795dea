"""tools/prune_asp.py: --check flags a hand-corrupted weight (checkpoint and exported model);
a prune + fine-tune run prints the density table and the sparse parameter/FLOP shares."""
import json
import os
import subprocess
import sys

import paddle
import pytest

from ppdlx import checkpoint as ckpt
from ppdlx.models import build_model
from ppdlx.sparsity import ASPHook, SparsityCheckError, check_path, raise_on_violation

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "prune_asp.py")
CORRUPT = "stages.2.0.conv2.conv"


def tool(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    out = tmp_path_factory.mktemp("asp_ckpt")
    paddle.seed(0)
    model = build_model("resnet18_bottleneck_tiny", num_classes=10)
    ckpt.save_checkpoint(str(out / "dense"), model.state_dict(), None, {"epoch": 1})
    hook = ASPHook()
    hook.attach(model)
    ckpt.save_checkpoint(str(out / "sparse"), model.state_dict(), None, {"hook:asp": hook.state_dict()})
    state = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    state[f"{CORRUPT}.weight"][5, 4:8, 1, 2] = 0.5  # one group of 4 input channels, all non-zero
    ckpt.save_checkpoint(str(out / "corrupt"), state, None, {"hook:asp": hook.state_dict()})
    return out, model


def test_check_cli_flags_a_corrupted_checkpoint(ckpts):
    out, _ = ckpts
    bad = tool("--check", str(out / "corrupt"))
    assert bad.returncode != 0
    lines = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and f"'{CORRUPT}'" in lines[0] and "Traceback" not in bad.stderr, bad.stderr
    assert "1 of 9216 groups" in lines[0]  # 64 x 3 x 3 positions x 16 groups of 4 input channels
    assert "VIOLATED" in bad.stdout  # the table is printed too


def test_check_checkpoints_in_process(ckpts):
    out, _ = ckpts
    good = check_path(str(out / "sparse.pdparams"))
    assert good["violations"] == 0 and good["checked"] == 16
    raise_on_violation(good)
    # no ASP state: shape rules; the RGB stem and the classifier are not expected sparse
    dense = check_path(str(out / "dense"))
    assert dense["first_violation"] == "stages.0.0.conv1.conv" and dense["violations"] == 16
    status = {r["layer"]: r["status"] for r in dense["rows"]}
    assert status["stem.conv"] == status["fc"] == "dense"


def test_check_exported_model(ckpts, tmp_path):
    _, model = ckpts
    model.eval()
    spec = [paddle.static.InputSpec([None, 3, 32, 32], "float32", "x")]
    paddle.jit.save(model, str(tmp_path / "good" / "inference"), input_spec=spec)
    result = check_path(str(tmp_path / "good"))
    assert result["violations"] == 0 and result["checked"] == 16, result["rows"]
    classifier = [r for r in result["rows"] if r["kind"] == "linear"]
    assert len(classifier) == 1 and classifier[0]["status"] == "dense"

    w = dict(model.named_parameters())[f"{CORRUPT}.weight"]
    saved = w.numpy().copy()
    corrupted = saved.copy()
    corrupted[0, 0:4, 0, 0] = 1.0
    w.set_value(corrupted)
    try:
        paddle.jit.save(model, str(tmp_path / "bad" / "inference"), input_spec=spec)
    finally:
        w.set_value(saved)
    result = check_path(str(tmp_path / "bad" / "inference.pdiparams"))
    assert result["violations"] == 1 and result["first_violation"].startswith(w.name + " ")
    with pytest.raises(SparsityCheckError, match=w.name):
        raise_on_violation(result)


def test_prune_and_finetune_cli(ckpts, tmp_path):
    out, _ = ckpts
    report = tmp_path / "report.json"
    run = tool("-c", os.path.join(ROOT, "configs", "demo", "rn50_asp_demo.yaml"), "-o",
               f"model.weights={out / 'dense'}", f"global.output_dir={tmp_path / 'asp'}", "global.device=cpu",
               "model.name=resnet18_bottleneck_tiny", "data.backend=synthetic", "data.synthetic.num_images=16",
               "data.batch_size=8", "train.epochs=1", "ema.enabled=true", "--report", str(report))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "stages.3.0.conv2.conv" in run.stdout and "FLOPs:" in run.stdout
    rep = json.loads(report.read_text())
    assert rep["sparsity"]["sparse_layers"] == 16 and rep["check"]["violations"] == 0
    assert 45.0 < rep["sparsity"]["params_zero_pct"] < 50.0
    assert 0 < rep["sparsity"]["flops_skippable_pct"] < rep["sparsity"]["flops_in_sparse_layers_pct"]
    again = check_path(str(tmp_path / "asp" / "latest"))
    assert again["violations"] == 0 and any(r["kind"] == "ema" and r["status"] == "2:4" for r in again["rows"])
    missing = tool("-c", os.path.join(ROOT, "configs", "demo", "rn50_asp_demo.yaml"), "-o", "model.weights=",
                   "global.device=cpu")
    assert missing.returncode != 0 and "model.weights" in missing.stderr


def test_pruning_a_detector_reports_its_average_precision(tmp_path):
    """Before: the final line of an EfficientDet prune + fine-tune said 'final: top1 0.0000 top5 0.0000' (the
    classifier's metrics, absent from a detector's report) while its evaluation computed AP."""
    from ppdlx.data.synthetic_coco import make_synthetic_coco
    data = tmp_path / "shapes"
    make_synthetic_coco(str(data), num_train=8, num_val=4)
    config = os.path.join(ROOT, "configs", "demo", "efficientdet_demo.yaml")
    overrides = [f"data.root={data}", "data.batch_size=4", "eval.batch_size=4", "train.epochs=1",
                 "train.steps_per_epoch=1", "detection.precise_bn_batches=0", f"global.output_dir={tmp_path / 'run'}"]
    # the dense detector's weights, built in a process of its own: building it here changed what later tests of this
    # process named their optimizer states
    build = (f"import sys, paddle; sys.path.insert(0, {ROOT!r}); from ppdlx.config import load_config; "
             f"from ppdlx.tasks import task_of; cfg = load_config({config!r}, {overrides!r}); paddle.seed(0); "
             f"paddle.save(task_of(cfg).build_model(cfg, 3).state_dict(), {str(tmp_path / 'dense.pdparams')!r})")
    made = subprocess.run([sys.executable, "-c", build], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert made.returncode == 0, made.stderr[-2000:]
    proc = tool("-c", config, "--report", str(tmp_path / "report.json"), "-o", *overrides,
                f"model.weights={tmp_path / 'dense.pdparams'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    final = [line for line in proc.stdout.splitlines() if line.startswith("final: ")]
    assert final == [f"final: AP {report['AP']:.4f} AP50 {report['AP50']:.4f} AP75 {report['AP75']:.4f} (1 epochs) "
                     f"-> {tmp_path / 'run'}; {tmp_path / 'run' / 'latest'}: {report['check']['checked']} weights "
                     f"checked, 0 violating"]
