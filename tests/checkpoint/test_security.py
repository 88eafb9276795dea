"""No checkpoint file makes a tool run code: payload pickles planted as ``model.weights`` (a ``.pdparams`` and a
checkpoint directory), as each file of a checkpoint directory (manifest.json re-hashed) for ``train.resume=auto``,
as the EMA's ``.pdstates`` and as a distillation teacher are refused by every tool that reads them, in one line
naming the file and the global, with a non-zero exit; the payload's marker file never appears."""
import glob
import os
import shutil
import subprocess
import sys

import pytest

from tests.engine.test_training import tiny_overrides
from tests.weights.test_paddle_pickle import PAYLOADS, plant

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "configs", "demo")


def tool(name, *args):
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "tools", name), *map(str, args)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def trained(tiny_tree, tmp_path_factory):
    """One tiny run (1 epoch, with EMA): the checkpoint every planted copy starts from."""
    out = tmp_path_factory.mktemp("security") / "run"
    proc = tool("train.py", "-c", os.path.join(CONFIGS, "rn50_demo.yaml"), "-o",
                *tiny_overrides(tiny_tree, out, "train.epochs=1", "ema.enabled=true", "ema.decay=0.9"))
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    return out


def test_planted_payloads_are_refused_by_every_tool_and_never_run(trained, tiny_tree, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()

    def payload(kind):
        make, refused = PAYLOADS[kind]
        return make(markers / kind.replace(".", "_")), refused

    def planted_copy(name, role_file, kind):
        """A copy of the trained run whose ``latest/<role_file>`` carries a payload (manifest re-hashed)."""
        run = tmp_path / name
        shutil.copytree(trained, run, symlinks=True)
        evil, refused = payload(kind)
        return run, plant(run / "latest" / role_file, evil), refused

    def planted_file(name, kind):
        evil, refused = payload(kind)
        return plant(tmp_path / f"{name}.pdparams", evil), refused

    image = sorted(glob.glob(os.path.join(tiny_tree, "val", "*", "*")))[0]
    rn50 = ("-c", os.path.join(CONFIGS, "rn50_demo.yaml"), "-o", *tiny_overrides(tiny_tree, tmp_path / "out"))
    cases = {}  # name -> (process, file the line must name, global it must name)
    file, refused = planted_file("evil", "os.system")
    cases["eval"] = tool("eval.py", *rn50, f"model.weights={tmp_path}/evil"), file, refused
    cases["check"] = tool("prune_asp.py", "--check", file), file, refused
    file, refused = planted_file("evil_exec", "exec")
    cases["infer"] = tool("infer.py", *rn50, f"model.weights={file}", "--image", image), file, refused
    file, refused = planted_file("evil_getattr", "getattr")
    cases["train"] = tool("train.py", *rn50, f"model.weights={file}"), file, refused
    file, refused = planted_file("evil_eval", "eval")
    cases["quantize"] = (tool("quantize.py", *rn50, f"model.weights={file}", "--calib-images", f"{tiny_tree}/train",
                              "--output-dir", tmp_path / "int8"), file, refused)
    teacher = tmp_path / "teacher.yaml"  # the tiny model as the teacher: the student's 4 classes
    teacher.write_text(f"_BASE_: [{CONFIGS}/rn50_demo.yaml]\nmodel:\n  name: resnet18_bottleneck_tiny\n"
                       f"  num_classes: 4\n")
    cases["distill"] = (tool("train.py", "-c", os.path.join(CONFIGS, "gpunet_distill_demo.yaml"), "-o",
                             f"data.root={tiny_tree}", f"global.output_dir={tmp_path / 'student'}", "data.workers=0",
                             "data.backend=paddle", "model.num_classes=4", f"distill.teacher_config={teacher}",
                             f"distill.teacher_weights={file}"), file, refused)
    run, file, refused = planted_copy("weights_unit", "model.pdparams", "subprocess")
    cases["export"] = (tool("export_model.py", *rn50, f"model.weights={run}/latest", "--output-dir",
                            tmp_path / "export"), file, refused)
    run, file, refused = planted_copy("ema_states", "states.pdstates", "os.system")  # the EMA copy is read there
    cases["ema"] = tool("eval.py", *rn50, f"model.weights={run}/latest"), file, refused
    for role_file, kind in (("model.pdparams", "eval"), ("optimizer.pdopt", "getattr"),
                            ("states.pdstates", "os.system")):
        run, file, refused = planted_copy(f"resume_{role_file}", role_file, kind)
        overrides = tiny_overrides(tiny_tree, run, "train.epochs=2", "ema.enabled=true", "train.resume=auto")
        cases[f"resume {role_file}"] = (tool("train.py", "-c", os.path.join(CONFIGS, "rn50_demo.yaml"), "-o",
                                             *overrides), file, refused)

    wrong = {}
    for name, (proc, file, refused) in cases.items():
        _, stderr = proc.communicate(timeout=600)
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        if proc.returncode == 0 or "Traceback" in stderr or len(errors) != 1 or \
                f"{file}: refused to unpickle {refused}" not in errors[0]:
            wrong[name] = (proc.returncode, stderr[-2000:])
    assert wrong == {}
    assert sorted(os.listdir(markers)) == []
