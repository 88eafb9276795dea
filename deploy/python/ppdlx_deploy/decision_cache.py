"""Where measured choices (``--backend auto``, ``--precision auto``, ``--cpu-variant auto``) are kept,
and the facts each was made on: the CPU (model name and the flags that select kernels), the versions
of the runtimes installed, the threads, the batch size, the export's digest (program, weights and
ONNX file, and its ``--verify`` record) and the candidates with the measuring settings. A decision is
reused only while every fact is the same; any change is another key, so it is measured again.

The cache is one JSON file, ``~/.cache/ppdlx_deploy/cpu_plans.json`` (``$PPDLX_DEPLOY_CACHE`` moves
its folder), written whole through a temporary file and a rename, under a lock."""
from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
from typing import Dict, Optional

CACHE_ENV = "PPDLX_DEPLOY_CACHE"
CACHE_NAME = "cpu_plans.json"
# The distributions whose versions a decision depends on (the first one installed of each group).
RUNTIME_DISTRIBUTIONS = {"paddle": ("paddlepaddle", "paddlepaddle-gpu"), "onnxruntime": ("onnxruntime",),
                         "openvino": ("openvino",), "numpy": ("numpy",)}
CHUNK = 1 << 20


def cache_path() -> str:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "ppdlx_deploy")
    return os.path.join(root, CACHE_NAME)


def runtime_versions() -> Dict[str, Optional[str]]:
    """Installed versions of the runtimes, read from their package metadata (nothing is imported)."""
    versions = {}
    for name, distributions in RUNTIME_DISTRIBUTIONS.items():
        versions[name] = None
        for dist in distributions:
            try:
                versions[name] = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return versions


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def export_digest(model_dir: str, meta: dict, files: dict) -> str:
    """sha256 over what the candidates read: the program and weights (the sha256 ``inference.yml``
    records, which :func:`ppdlx_deploy.meta.model_files` has checked, else the file's own), the ONNX
    file, and the ``verify:`` record (it decides which candidates may run)."""
    recorded = meta.get("files") or {}
    parts = {}
    for key in ("model_file", "params_file"):
        name = os.path.basename(files[key])
        parts[name] = (recorded.get(name) or {}).get("sha256") or file_sha256(files[key])
    onnx_file = os.path.join(model_dir, meta["model"].get("onnx_file") or "inference.onnx")
    if os.path.isfile(onnx_file):
        parts[os.path.basename(onnx_file)] = file_sha256(onnx_file)
    parts["verify"] = json.dumps(meta.get("verify"), sort_keys=True, default=str)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def decision_facts(kind: str, features: dict, versions: dict, threads: int, batch_size: int, digest: str,
                   candidates, settings: dict) -> dict:
    """Everything a decision depends on; equal facts = the same decision."""
    return {"kind": kind, "cpu": features.get("model_name"), "flags": sorted(features.get("flags") or []),
            "versions": dict(sorted(versions.items())), "threads": int(threads), "batch_size": int(batch_size),
            "export": digest, "candidates": list(candidates), "settings": dict(sorted(settings.items()))}


def decision_key(facts: dict) -> str:
    return json.dumps(facts, sort_keys=True)


def load_cache(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            cache = json.load(f)
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def cached_decision(path: str, facts: dict) -> Optional[dict]:
    return load_cache(path).get(decision_key(facts))


def store_decision(path: str, facts: dict, entry: dict) -> None:
    """Add one decision. Read, added to and written under an exclusive lock (``path.lock``): processes
    deciding at the same time (a server's model instances) keep each other's entries."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(f"{path}.lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cache = load_cache(path)
        cache[decision_key(facts)] = dict(entry, facts=facts)
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(cache, f, indent=1)
        os.replace(tmp, path)
