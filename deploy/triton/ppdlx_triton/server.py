"""Start the ``tritonserver`` that the ``nvidia-pytriton`` wheel bundles (Triton 2.51 with its Python
backend, CPU only) on a model repository, on loopback ports, without pytriton's Python API.

What makes the bundled Python backend work with this interpreter (pytriton's own launcher,
``pytriton/server/triton_server.py``, does the same, plus a NumPy < 2 pin for its stub):

* a backend directory of our own holding the wheel's ``libtriton_python.so`` and
  ``triton_python_backend_utils.py`` and the stub built for THIS Python's version
  (``pytriton/tritonserver/python_backend_stubs/X.Y/``);
* ``LD_LIBRARY_PATH`` starting with this interpreter's own ``libpython`` folder, then the wheel's
  ``nvidia_pytriton.libs``. The stub links ``libpython3.X.so.1.0`` by name: without the first entry
  the loader finds the system's copy (Debian's 3.11.2 here) while the stub's ``sys.prefix`` is
  pyenv's 3.11.7, whose standard library then fails
  (``'_thread.RLock' object has no attribute '_recursion_count'`` in ``multiprocessing``);
* ``PYTHONPATH`` listing this interpreter's ``sys.path`` (its site-packages, a virtualenv's too), so
  the stub imports the same paddle/numpy/Pillow/PyYAML as this process.

The ONNX Runtime and TensorRT backends are not in the wheel: the ONNX route needs NVIDIA's server image
(``deploy/README.md``).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from typing import Dict, List, Optional

from ppdlx_deploy.errors import DeployError, UnsupportedError

WHEEL = "nvidia-pytriton==0.7.0"
INSTALL_HINT = f"pip install --no-deps {WHEEL} (the tritonserver binary with its Python backend)"


def bundle_dir() -> str:
    """``pytriton/tritonserver`` of the installed wheel, found without importing pytriton (its Python
    API and dependencies are not needed)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise UnsupportedError(f"no tritonserver: {INSTALL_HINT}")
    path = os.path.join(list(spec.submodule_search_locations)[0], "tritonserver")
    if not os.path.isfile(os.path.join(path, "bin", "tritonserver")):
        raise UnsupportedError(f"{path}/bin/tritonserver is missing: reinstall with {INSTALL_HINT}")
    return path


def python_library_dir() -> str:
    """The folder of this interpreter's shared libpython, which the backend stub must load."""
    libdir, library = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDLIBRARY") or ""
    if not libdir or not library.endswith(".so") or not os.path.isfile(os.path.join(libdir, library)):
        raise UnsupportedError(f"{sys.executable} has no shared libpython ({library or 'none'} in {libdir}): "
                               f"Triton's Python backend stub needs a Python built with --enable-shared")
    return libdir


def python_backend_dir(root: str, bundle: str) -> str:
    """``root/python`` assembled from the wheel: the backend library, its utilities and the stub for
    this Python version. Returns ``root`` (Triton's ``--backend-directory``)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = os.path.join(bundle, "python_backend_stubs", version, "triton_python_backend_stub")
    if not os.path.isfile(stub):
        raise UnsupportedError(f"{WHEEL} has no Python backend stub for Python {version} ({stub})")
    target = os.path.join(root, "python")
    os.makedirs(target, exist_ok=True)
    source = os.path.join(bundle, "backends", "python")
    for path in (os.path.join(source, "libtriton_python.so"), os.path.join(source, "triton_python_backend_utils.py"),
                 stub):
        shutil.copy2(path, target)
    return root


def server_environment(bundle: str, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ if base is None else base)
    libs = os.path.join(os.path.dirname(os.path.dirname(bundle)), "nvidia_pytriton.libs")
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (python_library_dir(), libs, env.get("LD_LIBRARY_PATH"))
                                             if p)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    env.pop("PYTHONHOME", None)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TritonServer:
    """``with TritonServer(repo) as server:`` starts tritonserver on free loopback ports, waits until
    every model is ready (or the server exits: its log's last lines are the error), and stops it
    (SIGINT, then SIGKILL after ``stop_timeout`` s). ``server.http_url`` / ``server.grpc_url`` are
    ``127.0.0.1:PORT``; ``server.log_path`` holds the server's output."""

    def __init__(self, repository: str, *, start_timeout: float = 180.0, stop_timeout: float = 30.0,
                 extra_args: Optional[List[str]] = None, work_dir: Optional[str] = None, verbose: bool = False,
                 http_port: Optional[int] = None, grpc_port: Optional[int] = None):
        self.repository = os.path.abspath(repository)
        if not os.path.isdir(self.repository):
            raise DeployError(f"--repository {repository}: no such directory (make one with deploy/triton/"
                              f"make_repo.py)")
        self.start_timeout, self.stop_timeout = start_timeout, stop_timeout
        self.extra_args, self.verbose = list(extra_args or []), verbose
        self._own_work_dir = work_dir is None
        self.work_dir = work_dir or tempfile.mkdtemp(prefix="ppdlx_triton_")
        self.process: Optional[subprocess.Popen] = None
        self.http_port, self.grpc_port = http_port, grpc_port
        self.log_path = os.path.join(self.work_dir, "tritonserver.log")

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def command(self, bundle: str, backends: str) -> List[str]:
        return [os.path.join(bundle, "bin", "tritonserver"), f"--model-repository={self.repository}",
                f"--backend-directory={backends}", f"--cache-directory={os.path.join(bundle, 'caches')}",
                "--http-address=127.0.0.1", f"--http-port={self.http_port}",
                "--grpc-address=127.0.0.1", f"--grpc-port={self.grpc_port}",
                "--allow-metrics=false", "--allow-gpu-metrics=false", "--strict-readiness=true",
                "--exit-on-error=true", "--exit-timeout-secs=10", f"--log-verbose={1 if self.verbose else 0}",
                *self.extra_args]

    def start(self) -> "TritonServer":
        bundle = bundle_dir()
        backends = python_backend_dir(os.path.join(self.work_dir, "backends"), bundle)
        env = server_environment(bundle)
        self.http_port, self.grpc_port = self.http_port or free_port(), self.grpc_port or free_port()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.command(bundle, backends), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        url = f"http://{self.http_url}/v2/health/ready"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise DeployError(f"tritonserver exited with code {self.process.returncode} while loading "
                                  f"{self.repository}: {self.load_failures() or self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.3)
        self.stop()
        raise DeployError(f"tritonserver not ready after {self.start_timeout:.0f} s: {self.log_tail()}")

    def load_failures(self, lines: int = 3) -> str:
        """The server log's first lines saying why a model did not load."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                failed = [line.strip() for line in f if "failed to load '" in line and line.startswith("E")]
        except OSError:
            return ""
        return " | ".join(failed[:lines])

    def log_tail(self, lines: int = 6) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                text = [line.strip() for line in f if line.strip()]
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:])

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> Optional[int]:
        """Stop the server (and its backend stubs: they watch their parent). Returns its exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=self.stop_timeout)
        return self.process.returncode

    def cleanup(self) -> None:
        self.stop()
        if self._own_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> "TritonServer":
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(self, *exc) -> bool:
        self.cleanup()
        return False
