"""Where the battery's cases run: a base directory of shared fixtures (a small digits tree, a
two-epoch training run, its exports, a small COCO set), built once and only when a case needs
them, and a fresh directory per case into which a case copies what it damages."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import threading
from typing import Callable, Dict, List, Optional

from .battery import SetupError
from .faults import copy_tree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CLASSIFICATION_CONFIG = "configs/demo/rn50_demo.yaml"
DETECTION_CONFIG = "configs/demo/efficientdet_demo.yaml"
# A few steps of the smallest classifier at 32 px: each training case runs in seconds. Enough steps per epoch
# that the kill-during-save runner, armed when the last epoch's first step is logged, is armed before that
# epoch's save begins.
CLASSIFICATION_OVERRIDES = ["model.name=resnet18_bottleneck_tiny", "data.batch_size=8", "train.steps_per_epoch=6",
                            "global.log_interval=1", "data.dali.num_threads=1"]
DETECTION_OVERRIDES = ["data.batch_size=4", "eval.batch_size=8", "train.epochs=1", "train.steps_per_epoch=1",
                       "eval.interval=1", "detection.precise_bn_batches=0", "global.log_interval=1"]
FIXTURE_EPOCHS = 2
TRAIN_PER_CLASS, VAL_PER_CLASS = 12, 4


class Fixtures:
    """Shared inputs, built on first use (thread-safe); a failed build is a SetupError for every user."""

    def __init__(self, base: str, root: str = ROOT):
        self.base, self.root = base, root
        self._built: Dict[str, object] = {}
        self._builders: Dict[str, Callable[[], str]] = {
            "digits": self._digits, "run": self._run, "export": self._export, "export_program": self._export_program,
            "coco": self._coco, "detection_run": self._detection_run,
        }
        self._locks = {name: threading.Lock() for name in self._builders}

    def get(self, name: str) -> str:
        with self._locks[name]:  # one lock per fixture: a builder may get() another fixture
            if name not in self._built:
                try:
                    self._built[name] = self._builders[name]()
                except SetupError as err:
                    self._built[name] = err
            value = self._built[name]
        if isinstance(value, SetupError):
            raise value
        return value

    def _call(self, argv: List[str], what: str, timeout: int = 600) -> None:
        proc = subprocess.run(argv, cwd=self.root, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            raise SetupError(f"fixture {what} failed (exit {proc.returncode}): {tail}")

    def _digits(self) -> str:
        import numpy as np
        from ppdlx.data.demo import load_digits_arrays, write_image_folder
        out = os.path.join(self.base, "digits")
        if not os.path.isdir(out):
            images, labels, names = load_digits_arrays()
            keep = np.concatenate([np.flatnonzero(labels == c)[:TRAIN_PER_CLASS + VAL_PER_CLASS]
                                   for c in range(len(names))])
            tmp = out + ".tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            write_image_folder(tmp, images[keep], labels[keep], names, 32, seed=0,
                               val_fraction=VAL_PER_CLASS / (TRAIN_PER_CLASS + VAL_PER_CLASS))
            os.replace(tmp, out)
        return out

    def train_argv(self, out: str, *overrides: str, data: Optional[str] = None,
                   epochs: int = FIXTURE_EPOCHS) -> List[str]:
        data = data or self.get("digits")
        return [sys.executable, os.path.join(self.root, "tools", "train.py"), "-c", CLASSIFICATION_CONFIG, "-o",
                *CLASSIFICATION_OVERRIDES, f"data.root={data}", f"train.epochs={epochs}", f"global.output_dir={out}",
                *overrides]

    def _run(self) -> str:
        out = os.path.join(self.base, "run")
        if not os.path.isfile(os.path.join(out, "done")):
            shutil.rmtree(out, ignore_errors=True)
            self._call(self.train_argv(out), "training run")
            open(os.path.join(out, "done"), "w").close()
        return out

    def export_argv(self, weights: str, out: str, *args: str, overrides=()) -> List[str]:
        return [sys.executable, os.path.join(self.root, "tools", "export_model.py"), "-c", CLASSIFICATION_CONFIG,
                "-o", *CLASSIFICATION_OVERRIDES, f"data.root={self.get('digits')}", f"model.weights={weights}",
                *overrides, "--output-dir", out, *args]

    def _export_to(self, name: str, *args: str) -> str:
        out = os.path.join(self.base, name)
        if not os.path.isfile(os.path.join(out, "inference.yml")):
            shutil.rmtree(out, ignore_errors=True)
            self._call(self.export_argv(os.path.join(self.get("run"), "latest"), out, *args), name)
        return out

    def _export(self) -> str:
        return self._export_to("export", "--onnx")

    def _export_program(self) -> str:
        return self._export_to("export_program", "--format", "program")

    def _coco(self) -> str:
        out = os.path.join(self.base, "coco")
        if not os.path.isdir(os.path.join(out, "annotations")):
            self._call([sys.executable, os.path.join(self.root, "tools", "make_synthetic_coco.py"), "--train", "16",
                        "--val", "8", "--output", out, "--force"], "COCO set")
        return out


    def _detection_run(self) -> str:
        """The detection demo trained one step on the COCO fixture (a checkpoint for the detection tools)."""
        out = os.path.join(self.base, "detection_run")
        if not os.path.isfile(os.path.join(out, "done")):
            shutil.rmtree(out, ignore_errors=True)
            self._call([sys.executable, os.path.join(self.root, "tools", "train.py"), "-c", DETECTION_CONFIG, "-o",
                        *DETECTION_OVERRIDES, f"data.root={self.get('coco')}", f"global.output_dir={out}"],
                       "detection training run")
            open(os.path.join(out, "done"), "w").close()
        return out


class Context:
    """One case's view: its own directory, the fixtures, and argv builders for the tools."""

    def __init__(self, fixtures: Fixtures, case_dir: str):
        self.fx, self.dir, self.root = fixtures, case_dir, fixtures.root
        os.makedirs(case_dir, exist_ok=True)

    def path(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    def copy(self, fixture: str, name: Optional[str] = None) -> str:
        """A private copy of a fixture (the case may damage it)."""
        return copy_tree(self.fx.get(fixture), self.path(name or fixture))

    def tool(self, script: str, *args: str) -> List[str]:
        """``script`` relative to the checkout, e.g. ``tools/eval.py`` or ``deploy/python/infer.py``."""
        return [sys.executable, os.path.join(self.root, script), *args]

    def train(self, out: str, *overrides: str, data: Optional[str] = None, epochs: int = FIXTURE_EPOCHS) -> List[str]:
        return self.fx.train_argv(out, *overrides, data=data, epochs=epochs)

    def classification(self, script: str, *overrides: str, data: Optional[str] = None,
                       args: tuple = ()) -> List[str]:
        """``script -c <demo config> -o <tiny overrides> ...`` (eval, export, infer, quantize, check_data)."""
        data = data or self.fx.get("digits")
        return self.tool(script, "-c", CLASSIFICATION_CONFIG, "-o", *CLASSIFICATION_OVERRIDES, f"data.root={data}",
                         f"global.output_dir={self.path('out')}", *overrides, *args)

    def detection(self, script: str, data: str, *overrides: str, args: tuple = ()) -> List[str]:
        return self.tool(script, "-c", DETECTION_CONFIG, "-o", *DETECTION_OVERRIDES, f"data.root={data}",
                         f"global.output_dir={self.path('out')}", *overrides, *args)

    def export(self, weights: str, out: str, *args: str, overrides=()) -> List[str]:
        return self.fx.export_argv(weights, out, *args, overrides=overrides)

    def deploy(self, model_dir: str, *args: str) -> List[str]:
        return self.tool("deploy/python/infer.py", "--model-dir", model_dir, *args)

    def an_image(self, split: str = "val") -> str:
        digits = self.fx.get("digits")
        folder = os.path.join(digits, split, sorted(os.listdir(os.path.join(digits, split)))[0])
        return os.path.join(folder, sorted(os.listdir(folder))[0])


def case_context_factory(fixtures: Fixtures, cases_dir: str) -> Callable:
    """Each case gets ``cases_dir/c<hash of its name>``: a neutral name, so that no word of the case's name
    appears in the paths a tool prints (a check looking for "width" must not find it in the path)."""
    def make(case) -> Context:
        path = os.path.join(cases_dir, "c" + hashlib.sha1(case.name.encode()).hexdigest()[:8])
        shutil.rmtree(path, ignore_errors=True)
        return Context(fixtures, path)
    return make
