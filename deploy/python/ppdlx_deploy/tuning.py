"""Measured choices on this machine, never by the CPU's vendor: ``--backend auto`` (the fastest CPU
runtime, :func:`choose_backend`) and, for paddle-cpu alone, ``--precision auto`` / ``--cpu-variant
auto`` (:func:`choose_cpu_plan`).

The candidates are what this CPU, this export and this installation allow: paddle-cpu with the plan
variants of :data:`ppdlx_deploy.plan.CPU_VARIANTS` that apply to the export format, onnxruntime and
OpenVINO when installed and the export has a file they read (a missing one is skipped with one line),
bf16 only on a CPU with bf16 hardware. A candidate whose case failed the export's ``--verify``
(``inference.yml`` ``verify:``) is not run at all. Each candidate runs in its own fresh worker
process (:mod:`ppdlx_deploy.workers`), on the same random batch, alternated over rounds. After two
rounds, a candidate whose outputs differ from the reference's (paddle-cpu fp32 with the default plan:
the program the export checked against the trained model) by more than the export check's tolerance
(:mod:`ppdlx_deploy.agreement`) is rejected, and only candidates within :data:`KEEP_WITHIN` of the
fastest run the remaining rounds. The lowest median of the per-round medians wins. The decision is cached with the facts it was made on
(:mod:`ppdlx_deploy.decision_cache`) and the predictor's first note says in one line what was chosen
and why.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .agreement import disagreement
from .cpu import cpu_features, has_bf16
from .decision_cache import (cache_path, cached_decision, decision_facts, export_digest, runtime_versions,
                             store_decision)
from .errors import DeployError, UnsupportedError
from .meta import is_quantized, load_meta, onnx_precision
from .plan import CPU_RUNTIMES, cpu_variants_for, runtime_installed
from .timing import alternating_order, spread
from .workers import WorkerError, run_in_worker

REFERENCE = "paddle-cpu fp32 default"
# After PRUNE_AFTER rounds of every candidate, those whose median is slower than KEEP_WITHIN times the
# fastest's are not measured further (one round alone is too noisy on a shared machine to prune on).
PRUNE_AFTER = 2
KEEP_WITHIN = 1.10


def candidate(backend: str, precision: str, variant: Optional[str] = None) -> dict:
    name = " ".join([backend, precision] + ([variant] if backend == "paddle-cpu" else []))
    options = {"cpu_variant": variant} if backend == "paddle-cpu" else {}
    return {"name": name, "backend": backend, "precision": precision, "options": options}


def cpu_candidates(fmt: str, precision: str, cpu_variant: Optional[str], features: dict) -> List[Tuple[str, str]]:
    """``(precision, variant)`` pairs of paddle-cpu worth timing for an export format on a CPU with ``features``."""
    if precision == "auto":
        precisions = ["fp32", "bf16"] if has_bf16(features) else ["fp32"]
    else:
        precisions = [precision]
    pairs = []
    for p in precisions:
        variants = cpu_variants_for(fmt, p) if cpu_variant == "auto" else [cpu_variant or "default"]
        pairs += [(p, v) for v in variants]
    return pairs


def failed_verify(meta: dict, backend: str, precision: str) -> Optional[str]:
    """The cause ``inference.yml`` ``verify:`` records when this backend and precision failed it, else None."""
    for case in (meta.get("verify") or {}).get("cases") or []:
        if (case.get("backend"), case.get("precision")) == (backend, precision) and not case.get("skipped") \
                and case.get("passed") is False:
            return str(case.get("cause") or "outside the gate")
    return None


def passed_verify(meta: dict, backend: str, precision: str) -> bool:
    return any((c.get("backend"), c.get("precision")) == (backend, precision) and c.get("passed") is True
               for c in (meta.get("verify") or {}).get("cases") or [])


def _nothing_runs(skipped: List[str]) -> UnsupportedError:
    return UnsupportedError("--backend auto: no CPU runtime can run this export here (" + "; ".join(skipped) + ")")


def runtime_candidates(model_dir: str, meta: dict, files: dict, precision: str, features: dict,
                       backends: Sequence[str] = CPU_RUNTIMES) -> Tuple[List[dict], List[str]]:
    """``(candidates, skipped)`` for ``--backend auto``: every runtime of ``backends`` installed here
    whose files the export has, with the precisions this CPU and the export's ``--verify`` allow;
    ``skipped`` holds one line per runtime or case left out, with the reason."""
    skipped = []
    if precision not in ("fp32", "bf16", "int8", "auto"):
        raise UnsupportedError(f"--backend auto --precision {precision}: choose fp32, bf16, int8 or auto")
    onnx_file = os.path.join(model_dir, meta["model"].get("onnx_file") or "inference.onnx")
    # a QAT export's ONNX file is a QDQ graph: onnxruntime runs it in int8, as written
    qdq = onnx_precision(meta) == "int8" and os.path.isfile(onnx_file) and runtime_installed("onnxruntime")
    qdq_failed = failed_verify(meta, "onnxruntime", "int8") if qdq else None
    if qdq_failed:  # never a candidate, like any runtime outside the export's --verify gate
        skipped.append(f"onnxruntime int8: failed this export's --verify ({qdq_failed[:120]})")
        qdq = False
    if is_quantized(files["model_file"]) or precision == "int8":
        if not is_quantized(files["model_file"]) and not qdq and not qdq_failed:
            raise UnsupportedError("--backend auto --precision int8 needs a quantised (QAT/PTQ) export: this "
                                   "model has no quantize ops")
        out = [candidate("paddle-cpu", "int8", "default")] if is_quantized(files["model_file"]) else []
        out += [candidate("onnxruntime", "int8")] if qdq else []
        if not out:
            raise _nothing_runs(skipped)
        return out, skipped + ["a quantised export runs int8 on paddle-cpu and, with a QDQ inference.onnx, "
                               "onnxruntime"]
    bf16_hardware = has_bf16(features)
    if precision == "bf16" and not bf16_hardware:
        raise UnsupportedError("--backend auto --precision bf16: this CPU has neither avx512_bf16 nor amx_bf16; "
                               "use --precision fp32")
    # fp32 unless bf16 was asked for; bf16 joins fp32 where the CPU has bf16 hardware and either auto asked
    # for it or this export's --verify passed it for that runtime (its rounding is the model's to bear)
    precisions = ["bf16"] if precision == "bf16" else ["fp32"] + (["bf16"] if bf16_hardware else [])
    out = [candidate("onnxruntime", "int8")] if qdq and precision == "auto" else []
    for backend in backends:
        if not runtime_installed(backend):
            package = "paddlepaddle" if backend == "paddle-cpu" else backend
            skipped.append(f"{backend}: not installed (pip install {package})")
            continue
        if backend == "onnxruntime" and not os.path.isfile(onnx_file):
            skipped.append("onnxruntime: the export has no inference.onnx (tools/export_model.py --onnx)")
            continue
        if backend in ("onnxruntime", "openvino") and onnx_precision(meta) == "int8":
            skipped.append(f"{backend} {precision}: the export's inference.onnx is a QDQ (int8) graph")
            continue
        if backend == "openvino" and not os.path.isfile(onnx_file) and files["format"] != "program":
            skipped.append("openvino: reads inference.onnx or a legacy inference.pdmodel, and the export has neither "
                           "(tools/export_model.py --onnx)")
            continue
        for p in precisions:
            if p == "bf16" and backend == "onnxruntime":
                continue  # onnxruntime is offered in fp32 only
            if p == "bf16" and precision == "fp32" and not passed_verify(meta, backend, p):
                skipped.append(f"{backend} bf16: not a candidate until --verify passes it on this export "
                               f"(or ask for --precision auto)")
                continue
            cause = failed_verify(meta, backend, p)
            if cause:
                skipped.append(f"{backend} {p}: failed this export's --verify ({cause[:120]})")
                continue
            variants = cpu_variants_for(files["format"], p) if backend == "paddle-cpu" else [None]
            out += [candidate(backend, p, v) for v in variants]
    if not out:
        raise _nothing_runs(skipped)
    return out, skipped


def measure(model_dir: str, candidates: List[dict], meta: dict, *, threads: int, batch_size: int, rounds: int,
            warmup: int, steps: int, check_outputs: bool,
            progress: Optional[Callable[[str], None]] = None) -> dict:
    """Rounds 1-2 (:data:`PRUNE_AFTER`): every candidate in its own worker, alternated; then the rejection
    of disagreeing outputs and the :data:`KEEP_WITHIN` rule; the remaining rounds: the rest. Returns per
    candidate its round medians, and the rejected."""
    def run(c: dict, round_index: int) -> Optional[dict]:
        spec = {"model_dir": model_dir, "backend": c["backend"], "precision": c["precision"], "threads": threads,
                "options": c["options"], "batch_sizes": [batch_size], "warmup": warmup, "steps": steps}
        if progress:
            progress(f"measuring {c['name']} (round {round_index + 1}/{rounds}, batch {batch_size}, {threads} "
                     f"thread(s))")
        try:
            return run_in_worker(dict(spec, label=c["name"]))
        except WorkerError as err:
            if c["name"] == REFERENCE and err.returncode == DeployError.exit_code and err.line.startswith("error: "):
                # the export itself is at fault (a damaged or wrong file): said as the one line it is, not hidden
                # behind another runtime that reads another file
                raise DeployError(err.line[len("error: "):]) from None
            rejected[c["name"]] = f"its worker failed: {str(err)[:160]}"
            return None

    by_name = {c["name"]: c for c in candidates}
    medians: Dict[str, List[float]] = {c["name"]: [] for c in candidates}
    rejected: Dict[str, str] = {}
    first: Dict[str, dict] = {}
    workers = 0

    def run_round(names: List[str], r: int) -> None:
        nonlocal workers
        for name in names:
            if name in rejected:
                continue
            reply = run(by_name[name], r)
            workers += 1
            if reply is not None:
                first.setdefault(name, reply)
                medians[name].append(float(np.median(reply["times_s"][str(batch_size)])) * 1000.0)

    order = alternating_order([c["name"] for c in candidates], rounds)
    for r in range(min(PRUNE_AFTER, rounds)):
        run_round(order[r], r)
    reference = first.get(REFERENCE)
    if check_outputs and reference is not None:
        for name, reply in first.items():
            if by_name[name]["precision"] == "fp32" and name != REFERENCE:
                why = disagreement(meta, reference["output_values"][str(batch_size)],
                                   reply["output_values"][str(batch_size)], REFERENCE)
                if why:
                    rejected[name] = why
    eligible = [n for n in medians if medians[n] and n not in rejected]
    if not eligible:
        raise DeployError("--backend auto: every candidate failed (" + "; ".join(f"{n}: {r}" for n, r in
                                                                               rejected.items()) + ")")
    best = min(float(np.median(medians[n])) for n in eligible)
    survivors = [n for n in eligible if float(np.median(medians[n])) <= KEEP_WITHIN * best]
    for r in range(PRUNE_AFTER, rounds):
        run_round([n for n in order[r] if n in survivors] if len(survivors) > 1 else [], r)
    eligible = [n for n in eligible if n not in rejected]
    return {"medians": {n: spread(medians[n])["median"] for n in eligible}, "round_medians": medians,
            "survivors": [n for n in survivors if n in eligible], "rejected": rejected, "workers": workers,
            "reference": REFERENCE if reference is not None else None,
            "outputs_compared": bool(check_outputs and reference is not None),
            "engines": {n: first[n].get("engine") for n in first}}


def _decide(kind: str, model_dir: str, meta: dict, files: dict, candidates: List[dict], skipped: List[str], *,
            threads: int, batch_size: int, rounds: int, warmup: int, steps: int, features: dict,
            versions: Optional[dict], cache_file: Optional[str], check_outputs: bool,
            progress: Optional[Callable[[str], None]]) -> dict:
    path = cache_file or cache_path()
    versions = runtime_versions() if versions is None else versions
    facts = decision_facts(kind, features, versions, threads, batch_size, export_digest(model_dir, meta, files),
                           [c["name"] for c in candidates], {"rounds": rounds, "warmup": warmup, "steps": steps,
                                                              "keep_within": KEEP_WITHIN, "prune_after": PRUNE_AFTER})
    entry = cached_decision(path, facts)
    cached = entry is not None
    if not cached:
        if progress:
            progress(f"{kind}: measuring {len(candidates)} candidate(s) once for this machine, export, batch and "
                     f"threads (cached in {path})")
        result = measure(model_dir, candidates, meta, threads=threads, batch_size=batch_size, rounds=rounds,
                         warmup=warmup, steps=steps, check_outputs=check_outputs, progress=progress)
        if not result["survivors"]:
            raise DeployError(f"{kind}: every candidate failed (" + "; ".join(f"{n}: {r}" for n, r in
                                                                             result["rejected"].items()) + ")")
        chosen = min(result["survivors"], key=lambda n: result["medians"][n])  # measured in every round
        entry = {"chosen": chosen, "spec": next(c for c in candidates if c["name"] == chosen), "skipped": skipped,
                 "measured": time.strftime("%Y-%m-%d %H:%M:%S"), "cpu": features.get("model_name"), **result}
        store_decision(path, facts, entry)
    entry = dict(entry, cached=cached, cache_file=path)
    entry["line"] = decision_line(kind, entry, batch_size, threads)
    return entry


def decision_line(kind: str, entry: dict, batch_size: int, threads: int) -> str:
    chosen, medians = entry["chosen"], entry["medians"]
    others = ", ".join(f"{n} {ms:.2f} ms" for n, ms in sorted(medians.items(), key=lambda kv: kv[1]) if n != chosen)
    rounds = max(len(v) for v in entry["round_medians"].values())
    parts = [f"{kind}: {chosen}, median {medians[chosen]:.2f} ms at batch {batch_size} with {threads} thread(s)",
             f"others: {others or 'none'}"]
    if entry["rejected"]:
        parts.append("rejected: " + ", ".join(f"{n} ({why})" for n, why in entry["rejected"].items()))
    if entry["skipped"]:
        parts.append("skipped: " + ", ".join(entry["skipped"]))
    if entry.get("outputs_compared") is False and kind == "backend auto":
        parts.append(f"outputs not compared ({REFERENCE} did not run)")
    parts.append(f"{'cached from ' if entry['cached'] else ''}{rounds} round(s) in separate processes on "
                 f"{entry['cpu']} at {entry['measured']} ({entry['cache_file']})")
    return "; ".join(parts)


def choose_backend(model_dir: str, meta: dict, files: dict, precision: str = "fp32", *, threads: int,
                   batch_size: int = 1, rounds: int = 3, warmup: int = 3, steps: int = 10,
                   features: Optional[dict] = None, versions: Optional[dict] = None,
                   cache_file: Optional[str] = None, backends: Sequence[str] = CPU_RUNTIMES,
                   progress: Optional[Callable[[str], None]] = None) -> dict:
    """``--backend auto``: the decision (``spec`` = the candidate to build, ``line``, ``cached``,
    ``medians``, ``rejected``, ``skipped``) for this export, precision, threads and batch size."""
    features = cpu_features() if features is None else features
    candidates, skipped = runtime_candidates(model_dir, meta, files, precision, features, backends)
    if len(candidates) == 1:
        c = candidates[0]
        why = "; ".join(skipped) or "the only candidate"
        return {"spec": c, "chosen": c["name"], "cached": False, "medians": {}, "rejected": {}, "skipped": skipped,
                "line": f"backend auto: {c['name']} ({why}; nothing to measure)"}
    return _decide("backend auto", model_dir, meta, files, candidates, skipped, threads=threads,
                   batch_size=batch_size, rounds=rounds, warmup=warmup, steps=steps, features=features,
                   versions=versions, cache_file=cache_file, check_outputs=True, progress=progress)


def choose_cpu_plan(model_dir: str, files: dict, precision: str, cpu_variant: Optional[str], *, threads: int,
                    batch_size: int = 1, rounds: int = 2, warmup: int = 3, steps: int = 10,
                    features: Optional[dict] = None, cache_file: Optional[str] = None, meta: Optional[dict] = None,
                    progress: Optional[Callable[[str], None]] = None) -> dict:
    """paddle-cpu with ``precision`` and/or ``cpu_variant`` ``auto``: ``{"precision", "cpu_variant",
    "line", "cached", "medians_ms"}`` (see the module's docstring)."""
    features = cpu_features() if features is None else features
    pairs = cpu_candidates(files["format"], precision, cpu_variant, features)
    if len(pairs) == 1:
        p, v = pairs[0]
        why = ("this CPU has neither avx512_bf16 nor amx_bf16, so oneDNN would emulate bf16"
               if precision == "auto" else "the only candidate")
        return {"precision": p, "cpu_variant": v, "line": f"cpu plan: {p} {v} ({why}; nothing to measure)",
                "cached": False, "medians_ms": {}}
    meta = meta or load_meta(model_dir)
    candidates = [candidate("paddle-cpu", p, v) for p, v in pairs]
    entry = _decide("cpu plan", model_dir, meta, files, candidates, [], threads=threads, batch_size=batch_size,
                    rounds=rounds, warmup=warmup, steps=steps, features=features, versions=None,
                    cache_file=cache_file, check_outputs=precision != "auto", progress=progress)
    spec = entry["spec"]
    return {"precision": spec["precision"], "cpu_variant": spec["options"]["cpu_variant"], "line": entry["line"],
            "cached": entry["cached"], "medians_ms": entry["medians"]}
