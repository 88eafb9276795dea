"""Packaging: the wheel carries every module, installs without Paddle in its requirements, trains from a venv
outside the checkout, and the Docker image cannot swap its GPU Paddle for the CPU wheel."""
import ast
import email.parser
import glob
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import make_digits_tree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_PADDLE = "paddlepaddle"
GPU_PADDLE = "paddlepaddle-gpu"
# Generated or local-only trees that are no part of a source distribution.
NOT_SOURCE = {".git", "data", "output", "build", "dist", ".pytest_cache"}


def _ignore_generated(directory, names):
    ignored = {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}
    if os.path.samefile(directory, ROOT):
        ignored |= NOT_SOURCE & set(names)
    return ignored


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel of the checkout, built offline from a copy (a build writes build/ and egg-info next to setup.py)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=_ignore_generated)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (path,) = glob.glob(str(tmp / "dist" / "ppdlx-*.whl"))
    return path


def wheel_requirements(wheel_path):
    with zipfile.ZipFile(wheel_path) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        message = email.parser.Parser().parsestr(zf.read(meta).decode())
    return [Requirement(r) for r in message.get_all("Requires-Dist") or []]


def selected(requirements, extras=()):
    """Requirements that apply with these extras (always the unconditional ones)."""
    return [r for r in requirements
            if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in ("", *extras))]


def installed_closure(names):
    """Canonical names of ``names`` and, where installed here, everything they require (their metadata)."""
    seen, todo = set(), [canonicalize_name(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += [canonicalize_name(r.name) for r in selected(map(Requirement, requires))]
    return seen


# ------------------------------------------------------------------------------------------------ Dockerfile

def dockerfile():
    """(base image, [(pip install arguments, ...)]) with ARG defaults substituted and continuations joined."""
    base, installs, _ = dockerfile_steps()
    return base, installs


def dockerfile_steps():
    """(base image, [pip install arguments], [scripts of ``python -c`` build checks])."""
    text = open(os.path.join(ROOT, "Dockerfile"), encoding="utf-8").read()
    lines = [ln for ln in text.replace("\\\n", " ").splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    args, base, installs, checks = {}, None, [], []
    for line in lines:
        keyword, _, rest = line.strip().partition(" ")
        rest = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), rest)
        if keyword.upper() == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            args[name.strip()] = value.strip()
        elif keyword.upper() == "FROM":
            base = rest.split()[0]
        elif keyword.upper() == "RUN":
            commands = shell_commands(rest)
            installs += [c[c.index("install") + 1:] for c in commands if "pip" in c and "install" in c]
            checks += [c[c.index("-c") + 1] for c in commands if c[0].startswith("python") and "-c" in c]
    return base, installs, checks


def shell_commands(script):
    """The simple commands of a shell list, as argument lists (quotes honoured, split on && || ; |)."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands = [[]]
    for token in lexer:
        if token in ("&&", "||", ";", "|", "&"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


VALUE_OPTIONS = {"-i", "--index-url", "--extra-index-url", "-f", "--find-links", "-c", "--constraint", "-t",
                 "--target", "--prefix", "--root", "--config-settings"}


def pulled_distributions(install_args, wheel_path):
    """Every distribution one ``pip install`` can put into the image, as far as can be known offline."""
    no_deps = "--no-deps" in install_args
    named, index, tokens = [], None, iter(install_args)
    for tok in tokens:
        if tok in ("-r", "--requirement"):
            path = os.path.join(ROOT, next(tokens))
            named += [ln.split("#")[0].strip() for ln in open(path, encoding="utf-8")]
        elif tok in ("-e", "--editable"):
            named.append(next(tokens))
        elif tok in ("-i", "--index-url"):
            index = next(tokens)
        elif tok in VALUE_OPTIONS:
            next(tokens)
        elif not tok.startswith("-"):
            named.append(tok)
    names, project = set(), set()
    for spec in filter(None, named):
        local = re.fullmatch(r"\.(?:/)?(?:\[(.*)\])?", spec)
        if local:  # the checkout itself: its wheel's requirements for the extras asked for
            project.add("ppdlx")
            extras = [e.strip() for e in (local.group(1) or "").split(",") if e.strip()]
            if not no_deps:
                names |= {canonicalize_name(r.name) for r in selected(wheel_requirements(wheel_path), extras)}
        else:
            names.add(canonicalize_name(Requirement(spec).name))
    return project | (names if no_deps else installed_closure(names)), index


def test_dockerfile_keeps_the_gpu_paddle_of_a_tensorrt_image(wheel):
    base, installs = dockerfile()
    tag = re.fullmatch(r"paddlepaddle/paddle:(3\.\d+\.\d+)-gpu-cuda(\d+)\.(\d+)-cudnn[\d.]+-trt(\d+)(?:\.\d+)*",
                       base or "")
    assert tag, f"base image {base!r} is not a Paddle 3.x GPU tag with TensorRT (-trtX.Y)"
    cuda_major, cuda_minor = tag.group(2), tag.group(3)
    assert installs, "the Dockerfile installs nothing with pip"
    for args in installs:
        pulled, index = pulled_distributions(args, wheel)
        assert CPU_PADDLE not in pulled, f"pip install {' '.join(args)} can install the CPU wheel"
        if GPU_PADDLE in pulled:  # Paddle's per-CUDA index must be the image's CUDA
            assert index and index.rstrip("/").endswith(f"cu{cuda_major}{cuda_minor}"), (args, base)
        for name in pulled:
            dali = re.fullmatch(r"nvidia-dali-cuda(\d+)", name)
            if dali:
                assert int(dali.group(1)) // 10 == int(cuda_major), f"{name} in a CUDA {cuda_major} image"
    everything = set().union(*(pulled_distributions(a, wheel)[0] for a in installs))
    assert {"ppdlx", "nvidia-dali-cuda120", "paddle2onnx", "onnxruntime", "pycocotools"} <= everything


def test_dockerfile_build_imports_paddle_tensorrt_and_matches_the_tensorrt_versions():
    """The default .json export reaches TensorRT through ``paddle.tensorrt``, which imports NVIDIA's ``tensorrt``
    module: an image without it, or with another TensorRT than Paddle was compiled against, must fail the build."""
    _, _, checks = dockerfile_steps()
    assert len(checks) == 1, checks
    tree = ast.parse(checks[0])
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert "paddle.tensorrt" in imported
    called = {}  # variable -> the paddle.inference function whose value it holds
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple):
            for target, value in zip(node.targets[0].elts, node.value.elts):
                calls = [n.func.attr for n in ast.walk(value) if isinstance(n, ast.Call)
                         and isinstance(n.func, ast.Attribute)]
                called[target.id] = calls
    compared = [{n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)} for node in ast.walk(tree)
                if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare)
                and isinstance(node.test.ops[0], ast.Eq)]
    versions = {name for names in compared for name in names if name in called}
    assert {fn for name in versions for fn in called[name]} >= {"get_trt_runtime_version", "get_trt_compile_version"}
    # the script runs here too, and fails loudly on a CPU Paddle (it would have passed silently if it were empty)
    run = subprocess.run([sys.executable, "-c", checks[0]], capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "AssertionError" in run.stderr, run.stderr[-400:]


# ------------------------------------------------------------------------------------------------ the wheel

def test_wheel_requires_no_paddle_and_offers_the_cpu_pin(wheel):
    requirements = wheel_requirements(wheel)
    always = {canonicalize_name(r.name) for r in selected(requirements)}
    assert not always & {CPU_PADDLE, GPU_PADDLE}, sorted(always)
    assert {"numpy", "pillow", "pyyaml", "pydantic", "scikit-learn"} <= always
    cpu = [r for r in selected(requirements, ["cpu"]) if r.marker is not None]
    pinned = [ln.strip() for ln in open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8")
              if ln.startswith(CPU_PADDLE + "==")]
    assert [str(r).split(";")[0].strip() for r in cpu] == pinned == ["paddlepaddle==3.3.1"]


def test_wheel_ships_every_module_and_data_file(wheel):
    with zipfile.ZipFile(wheel) as zf:
        shipped = {n for n in zf.namelist() if n.startswith(("ppdlx/", "ppdlx_deploy/"))}
    in_checkout = set()
    for package, source in (("ppdlx", "ppdlx"), ("ppdlx_deploy", "deploy/python/ppdlx_deploy")):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, source)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            sub = os.path.relpath(dirpath, os.path.join(ROOT, source)).replace(os.sep, "/")
            rel = package if sub == "." else f"{package}/{sub}"
            in_checkout |= {f"{rel}/{f}" for f in filenames if f.endswith((".py", ".cc", ".h", ".json"))}
    assert in_checkout - shipped == set()
    assert "ppdlx_deploy/cli.py" in shipped
    assert {"ppdlx/engine/run.py", "ppdlx/models/detection/__init__.py", "ppdlx/ops/onednn_kernels.cc",
            "ppdlx/ops/onednn_norm_pool.cc", "ppdlx/ops/onednn_common.h", "ppdlx/models/gpunet_archs/gpunet_0.json"} <= shipped


def test_import_without_paddle_says_which_builds_to_install(wheel, tmp_path):
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    # -I -S: no site-packages at all, so this interpreter really has no paddle
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); "
                           "import ppdlx"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: ppdlx needs PaddlePaddle, which is not installed"), last
    assert "pip install paddlepaddle==3.3.1 (CPU)" in last and "paddlepaddle-gpu" in last


# ------------------------------------------------------------------------------------------------ installed

def make_venv(path):
    """A venv that sees this interpreter's site-packages (paddle, numpy, DALI, pip) but has its own first.
    ``--system-site-packages`` alone gives the base interpreter's: when the suite itself runs in a virtualenv
    (README (b) as a user runs it), that one has none of the packages, so a .pth file adds this
    interpreter's site directories after the venv's own (``site.addsitedir``: their .pth files apply too, as
    they do for a system site)."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(path)],
                   check=True, timeout=120)
    (site,) = glob.glob(str(path / "lib" / "python*" / "site-packages"))
    running = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    with open(os.path.join(site, "_running_interpreter_site.pth"), "w", encoding="utf-8") as f:
        f.write("import site; " + "; ".join(f"site.addsitedir({p!r})" for p in running) + "\n")
    return str(path / "bin" / "python"), site


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A venv outside the checkout whose ppdlx is the wheel."""
    python, _ = make_venv(tmp_path_factory.mktemp("venv") / "env")
    # the system's pip (visible through the system site) installs into the venv; the system's own ppdlx
    # is outside the venv, so pip leaves it alone
    proc = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall", wheel],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return python


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """3 classes x 20 digits: 48 train / 12 val images."""
    return make_digits_tree(tmp_path_factory.mktemp("packaging") / "digits", per_class=20, classes=3)


def outside_env():
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def train_from_checkout_tools(python, tree, out, report, cwd):
    return subprocess.run(
        [python, os.path.join(ROOT, "tools", "train.py"), "-c", os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml"),
         "--report", str(report), "-o", f"data.root={tree}", "model.name=resnet18_bottleneck_tiny",
         "model.num_classes=3", "data.workers=0", "data.batch_size=8", "global.device=cpu",
         "global.cpu_fast_kernels=false", f"global.output_dir={out}", "train.epochs=1", "train.steps_per_epoch=2"],
        capture_output=True, text=True, timeout=600, cwd=str(cwd), env=outside_env())


def test_installed_wheel_trains_with_the_checkout_tools_from_outside(venv, digits, tmp_path):
    where = subprocess.run([venv, "-c", "import ppdlx, ppdlx.engine.run; print(ppdlx.__file__)"],
                           capture_output=True, text=True, timeout=120, cwd=str(tmp_path), env=outside_env())
    assert where.returncode == 0, where.stderr[-2000:]
    assert where.stdout.strip().startswith(os.path.dirname(os.path.dirname(venv)) + os.sep)
    val_images = len(glob.glob(os.path.join(digits, "val", "*", "*.jpg")))
    out, report = tmp_path / "out", tmp_path / "report.json"
    proc = train_from_checkout_tools(venv, digits, out, report, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(report.read_text())
    assert result["images"] == val_images == 12
    assert result["epochs"] == 1
    assert all((out / "latest" / f).is_file() for f in ("model.pdparams", "optimizer.pdopt", "states.pdstates"))
    assert f"({val_images} val images, 1 epochs)" in proc.stdout


def test_checkout_tools_do_not_hide_a_broken_install(venv, digits, tmp_path):
    """The tools' sys.path fallback to the checkout must not mask an installed ppdlx that lacks a subpackage."""
    site = subprocess.run([venv, "-c", "import os, ppdlx; print(os.path.dirname(ppdlx.__file__))"],
                          capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                          env=outside_env()).stdout.strip()
    deploy = subprocess.run([venv, "-c", "import importlib.util as u; "
                                         "print(u.find_spec('ppdlx_deploy').submodule_search_locations[0])"],
                            capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                            env=outside_env()).stdout.strip()
    python, target = make_venv(tmp_path / "broken")
    shutil.copytree(site, os.path.join(target, "ppdlx"), ignore=shutil.ignore_patterns("engine"))
    shutil.copytree(deploy, os.path.join(target, "ppdlx_deploy"))  # installed with ppdlx (setup.py); complete here
    # An editable install in the system site (CI's `pip install -e .`) puts a meta-path finder there that
    # resolves any missing ppdlx subpackage from the checkout; a user's separate broken install has none.
    # site.py runs sitecustomize after every .pth file, so this drops the finder the system .pth added.
    with open(os.path.join(target, "sitecustomize.py"), "w") as f:
        f.write("import sys\n"
                "sys.meta_path[:] = [f for f in sys.meta_path\n"
                "                    if not getattr(f, '__module__', '').startswith('__editable__')]\n")
    hidden = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('ppdlx.engine'))"],
                            capture_output=True, text=True, timeout=120, cwd=str(tmp_path), env=outside_env())
    assert hidden.stdout.strip() == "None", hidden.stdout + hidden.stderr[-2000:]
    proc = train_from_checkout_tools(python, digits, tmp_path / "out", tmp_path / "report.json", tmp_path)
    assert proc.returncode == 1
    assert "ModuleNotFoundError: No module named 'ppdlx.engine'" in proc.stderr
