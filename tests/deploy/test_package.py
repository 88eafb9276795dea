"""deploy/python is a package of small modules (ppdlx_deploy) that runs without ppdlx, with
deploy/python/infer.py as its thin command line; ppdlx finds that package from an option, an
environment variable or the checkout, and says in one line when it cannot."""
import ast
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.infer import DEPLOY_DIR_ENV, find_deploy_dir, load_deploy_module
from ppdlx.config import load_config
from ppdlx.errors import ConfigError
from ppdlx.export import export_model
from tests.conftest import make_digits_tree

D = load_deploy_module()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY_PY = os.path.join(ROOT, "deploy", "python")
INFER = os.path.join(DEPLOY_PY, "infer.py")
PACKAGE = os.path.join(DEPLOY_PY, "ppdlx_deploy")

# Run first in the subprocess: any import of ppdlx fails, as on a serving host without it.
WITHOUT_PPDLX = r"""
import importlib.abc, sys

class NoPpdlx(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "ppdlx" or name.startswith("ppdlx."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None

sys.meta_path.insert(0, NoPpdlx())
try:
    import ppdlx
except ModuleNotFoundError:
    pass
else:
    raise SystemExit("the blocker let ppdlx through")
"""

PREDICT = r"""
sys.path.insert(0, DEPLOY_PY)
import numpy as np
import ppdlx_deploy as D
pipeline = D.Pipeline.open(MODEL_DIR, BACKEND, "fp32", threads=1)
outputs = [out[0] for _, _, out in pipeline.batches(PATHS, 2)]
np.save(SAVE_TO, np.concatenate(outputs))
leaked = sorted(m for m in sys.modules if m == "ppdlx" or m.startswith("ppdlx."))
assert not leaked, leaked
"""

RUN_CLI = r"""
import runpy
sys.argv = [INFER] + ARGS
runpy.run_path(INFER, run_name="__main__")
"""


def _without_ppdlx(code: str, cwd, **values):
    """``python -I`` (no PYTHONPATH, no user site, no cwd on sys.path) with ppdlx blocked."""
    assignments = "".join(f"{name} = {value!r}\n" for name, value in values.items())
    return subprocess.run([sys.executable, "-I", "-c", WITHOUT_PPDLX + assignments + code], cwd=str(cwd),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A small ppdlx classifier (random init) exported with ONNX, and real digit JPEGs."""
    base = tmp_path_factory.mktemp("deploy_pkg")
    images = make_digits_tree(base / "digits", per_class=2, size=40, classes=3)
    cfg = load_config(None, ["model.name=resnet18_bottleneck_tiny", "model.num_classes=3",
                             "data.transforms.crop_size=32", "data.transforms.resize_short=36",
                             "data.root=/nonexistent", "global.seed=5"])
    model_dir = str(base / "model")
    export_model(cfg, output_dir=model_dir, onnx=True, labels=["zero", "one", "two"], check_batch_sizes=(2,))
    paths = D.list_images(images)
    assert len(paths) == 6
    return base, model_dir, paths


@pytest.mark.parametrize("backend", ["paddle-cpu", "onnxruntime"])
def test_deploy_predicts_without_ppdlx_as_in_process(exported, backend):
    if backend == "onnxruntime":
        pytest.importorskip("onnxruntime")
    base, model_dir, paths = exported
    save_to = str(base / f"{backend}.npy")
    proc = _without_ppdlx(PREDICT, base, DEPLOY_PY=DEPLOY_PY, MODEL_DIR=model_dir, BACKEND=backend, PATHS=paths,
                          SAVE_TO=save_to)
    assert proc.returncode == 0, proc.stderr[-3000:]
    isolated = np.load(save_to)
    pipeline = D.Pipeline.open(model_dir, backend, "fp32", threads=1)
    in_process = np.concatenate([out[0] for _, _, out in pipeline.batches(paths, 2)])
    assert isolated.shape == (6, 3) and np.abs(in_process).max() > 0
    np.testing.assert_array_equal(isolated, in_process)


def test_command_line_without_ppdlx_prints_what_it_prints_in_process(exported, capsys):
    base, model_dir, paths = exported
    args = ["--model-dir", model_dir, "--input", os.path.dirname(os.path.dirname(paths[0])), "--batch-size", "4",
            "--threads", "1", "--topk", "2", "--backend", "paddle-cpu"]
    proc = _without_ppdlx(RUN_CLI, base, INFER=INFER, ARGS=args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert D.cli.run(args) == 0
    in_process = capsys.readouterr().out
    assert proc.stdout == in_process
    lines = in_process.splitlines()
    assert [line.split(": ")[0] for line in lines] == paths
    assert all(line.count("(id ") == 2 and any(n in line for n in ("zero", "one", "two")) for line in lines)
    # the one-line error and its exit code come through the entry point unchanged
    missing = _without_ppdlx(RUN_CLI, base, INFER=INFER, ARGS=["--model-dir", model_dir, "--input", "/nonexistent"])
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.strip() == "error: --input /nonexistent: no such file or directory"


def _imported_top_names(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module.split(".")[0]


def test_deploy_is_a_package_of_small_modules_importing_no_ppdlx():
    allowed = {"paddle", "numpy", "PIL", "yaml", "onnxruntime", "openvino", "tensorrt", "ppdlx_deploy"}
    sources = [os.path.join(PACKAGE, f) for f in sorted(os.listdir(PACKAGE)) if f.endswith(".py")] + [INFER]
    assert len(sources) >= 8  # split by concern, not one file
    for path in sources:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        assert text.count("\n") <= 400, path
        foreign = set(_imported_top_names(ast.parse(text))) - allowed - set(sys.stdlib_module_names)
        assert not foreign, (path, foreign)
    with open(INFER, encoding="utf-8") as f:
        entry = ast.parse(f.read())
    # the entry point only hands over to the package's command line
    assert not [n for n in entry.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert os.path.dirname(D.cli.__file__) == PACKAGE and D.cli.run.__module__ == "ppdlx_deploy.cli"


def test_deploy_package_is_found_from_option_environment_or_checkout(tmp_path, monkeypatch):
    monkeypatch.delenv(DEPLOY_DIR_ENV, raising=False)
    assert find_deploy_dir() == PACKAGE
    assert find_deploy_dir(os.path.join(ROOT, "deploy")) == PACKAGE  # a checkout's deploy/ works too
    with pytest.raises(ConfigError) as err:
        find_deploy_dir(str(tmp_path))
    assert str(err.value) == (f"--deploy-dir={tmp_path}: no ppdlx_deploy/ package there (expected "
                              f"{tmp_path}/ppdlx_deploy/__init__.py); point it at deploy/python of a ppdlx checkout")
    copy = tmp_path / "elsewhere"
    shutil.copytree(PACKAGE, copy / "ppdlx_deploy")
    monkeypatch.setenv(DEPLOY_DIR_ENV, str(copy))
    assert find_deploy_dir() == str(copy / "ppdlx_deploy")
    assert find_deploy_dir(DEPLOY_PY) == PACKAGE  # the option wins over the environment
    # this process already runs the checkout's package: a second copy is refused, not mixed in
    with pytest.raises(ConfigError, match=f"^ppdlx_deploy is already imported from {PACKAGE} in this process"):
        load_deploy_module()
    assert load_deploy_module(DEPLOY_PY) is D


def test_missing_deploy_package_is_one_line(tmp_path):
    code = ("import sys\n"
            f"sys.path.append({ROOT!r})  # the checkout's benchmarks package, as the tools find it\n"
            "import benchmarks.deploy_package as b\n"
            "b.CHECKOUT_DEPLOY_DIR = '/nonexistent/deploy/python'  # as in an installed wheel\n"
            # an editable install (PEP 660) maps ppdlx_deploy too: a None entry makes it absent, as in a wheel
            # built without it
            "sys.modules['ppdlx_deploy'] = None\n"
            "from ppdlx.errors import ConfigError\n"
            "try:\n    b.load_deploy_module()\nexcept ConfigError as err:\n    print(err)\n")
    env = {k: v for k, v in os.environ.items() if k != DEPLOY_DIR_ENV}
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == ("the deploy package ppdlx_deploy was not found: not in /nonexistent/deploy/python and not "
                           "installed; pass --deploy-dir or set PPDLX_DEPLOY_DIR to deploy/python of a ppdlx "
                           "checkout\n")
