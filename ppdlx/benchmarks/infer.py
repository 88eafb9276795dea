"""Inference speed: ppdlx's deploy predictor (Paddle Inference, CPU) vs onnxruntime on the same export.

Exports the configured classifier (ResNet50 at 224 by default; random weights are fine for
speed) with ``--onnx``, imports the deploy package ``ppdlx_deploy`` (deploy/ does not import
ppdlx, and ppdlx does not depend on deploy/: it is found at run time, see
:func:`find_deploy_dir`), builds its predictors and times the network call (input copy + run +
output copy) with the cases interleaved batch by batch, so the load of other processes on this
shared machine hits every case alike. Latency percentiles are true percentiles
(numpy.percentile) of per-batch times, warm-up excluded.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time
from typing import Optional

from ppdlx.errors import ConfigError

DEPLOY_PACKAGE = "ppdlx_deploy"
DEPLOY_DIR_ENV = "PPDLX_DEPLOY_DIR"
# deploy/python of the checkout this ppdlx was imported from (absent in an installed wheel).
CHECKOUT_DEPLOY_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                   "deploy", "python")


def _package_dir_in(directory: str) -> Optional[str]:
    """The ppdlx_deploy package under ``directory`` (deploy/python, or a checkout's deploy/)."""
    for candidate in (os.path.join(directory, DEPLOY_PACKAGE), os.path.join(directory, "python", DEPLOY_PACKAGE)):
        if os.path.isfile(os.path.join(candidate, "__init__.py")):
            return candidate
    return None


def find_deploy_dir(deploy_dir: Optional[str] = None) -> Optional[str]:
    """The folder of the ``ppdlx_deploy`` package to use: ``deploy_dir`` (``--deploy-dir``), else
    ``$PPDLX_DEPLOY_DIR``, else this checkout's deploy/python; None when none is given and the
    checkout has none, so that an installed ``ppdlx_deploy`` is used. A folder given but holding
    no package is a one-line ConfigError."""
    for given, origin in ((deploy_dir, "--deploy-dir"), (os.environ.get(DEPLOY_DIR_ENV), DEPLOY_DIR_ENV)):
        if given:
            package_dir = _package_dir_in(given)
            if package_dir is None:
                raise ConfigError(f"{origin}={given}: no {DEPLOY_PACKAGE}/ package there (expected "
                                  f"{os.path.join(given, DEPLOY_PACKAGE, '__init__.py')}); point it at deploy/python "
                                  f"of a ppdlx checkout")
            return package_dir
    return _package_dir_in(CHECKOUT_DEPLOY_DIR)


def load_deploy_module(deploy_dir: Optional[str] = None):
    """The deploy package ``ppdlx_deploy`` (its public API: load_meta, Pipeline, PaddlePredictor,
    ...), imported from :func:`find_deploy_dir`'s folder or, without one, as installed. Cached in
    sys.modules; asking for a second copy from another folder in the same process is refused."""
    package_dir = find_deploy_dir(deploy_dir)
    loaded = sys.modules.get(DEPLOY_PACKAGE)
    if loaded is not None:
        loaded_dir = os.path.dirname(os.path.abspath(loaded.__file__))
        if package_dir is not None and os.path.realpath(loaded_dir) != os.path.realpath(package_dir):
            raise ConfigError(f"{DEPLOY_PACKAGE} is already imported from {loaded_dir} in this process; "
                              f"cannot also load {package_dir}")
        return loaded
    if package_dir is None:
        if importlib.util.find_spec(DEPLOY_PACKAGE) is None:
            raise ConfigError(f"the deploy package {DEPLOY_PACKAGE} was not found: not in {CHECKOUT_DEPLOY_DIR} "
                              f"and not installed; pass --deploy-dir or set {DEPLOY_DIR_ENV} to deploy/python of "
                              f"a ppdlx checkout")
        return importlib.import_module(DEPLOY_PACKAGE)
    spec = importlib.util.spec_from_file_location(DEPLOY_PACKAGE, os.path.join(package_dir, "__init__.py"),
                                                  submodule_search_locations=[package_dir])
    module = importlib.util.module_from_spec(spec)
    sys.modules[DEPLOY_PACKAGE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        for name in [n for n in sys.modules if n == DEPLOY_PACKAGE or n.startswith(DEPLOY_PACKAGE + ".")]:
            del sys.modules[name]
        raise
    return module


def add_arguments(parser):
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("-o", "--override", action="append", nargs="+", default=[])
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--repeats", type=int, default=20, help="timed batches per case and batch size")
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches per case and batch size")
    parser.add_argument("--threads", type=int, help="CPU threads for every case (default: cores available)")
    parser.add_argument("--resolution", type=int, default=224)
    parser.add_argument("--model-dir", help="export here (default: <global.output_dir>/bench_infer); "
                                            "an export with the same model/resolution is reused")
    parser.add_argument("--format", choices=("pir", "program"), default="program",
                        help="Paddle program format to export (ONNX is converted from the same export); "
                             "program (.pdmodel) runs on the classic executor and allows the OpenVINO engine")
    parser.add_argument("--reexport", action="store_true", help="export even if a matching export exists")
    parser.add_argument("--openvino", action="store_true",
                        help="add Paddle Inference's OpenVINO engine case (needs --format program)")
    parser.add_argument("--untuned", action="store_true",
                        help="add the untuned Paddle predictor (default executor) to show what tuning buys")
    parser.add_argument("--deploy-dir", help=f"folder holding the {DEPLOY_PACKAGE} package (default: "
                                             f"${DEPLOY_DIR_ENV}, else deploy/python of this checkout, else the "
                                             f"installed package)")


def _ensure_export(cfg, model_dir: str, fmt: str, reexport: bool) -> dict:
    from ppdlx.export import export_model
    meta_path = os.path.join(model_dir, "inference.yml")
    if not reexport and os.path.isfile(meta_path):
        import yaml
        with open(meta_path, encoding="utf-8") as f:
            meta = yaml.safe_load(f)
        same = (meta.get("model", {}).get("name") == cfg.model.name and meta["model"].get("format") == fmt
                and meta["model"].get("onnx_file") and meta["inputs"][0]["shape"][-1] in
                (cfg.data.transforms.crop_size,) and meta["model"].get("num_classes") == cfg.model.num_classes
                and os.path.isfile(os.path.join(model_dir, meta["model"]["onnx_file"])))
        if same:
            return {"reused": True, "seconds": 0.0}
    report = export_model(cfg, output_dir=model_dir, onnx=True, fmt=fmt, check_batch_sizes=(1,), rtol=1e-3)
    return {"reused": False, "seconds": report["seconds"], "checks": report["checks"]}


def run(args) -> dict:
    from ppdlx.config import flatten_overrides, load_config
    D = load_deploy_module(args.deploy_dir)  # before the export: a missing deploy package is one line, at once
    overrides = list(flatten_overrides(args.override)) + [f"data.transforms.crop_size={args.resolution}",
                                                          f"data.transforms.resize_short={int(args.resolution * 8 / 7)}"]
    cfg = load_config(args.config, overrides)
    if cfg.model.name.startswith("efficientdet"):
        raise ConfigError("benchmark infer: classification models only (model.name=%s)" % cfg.model.name)
    batch_sizes = [int(b) for b in str(args.batch_sizes).split(",") if b]
    model_dir = args.model_dir or os.path.join(cfg.global_cfg.output_dir, "bench_infer")
    export = _ensure_export(cfg, model_dir, args.format, args.reexport)

    threads = args.threads or D.default_threads()
    meta = D.load_meta(model_dir)
    predictors = {"ppdlx paddle-cpu fp32": D.PaddlePredictor(model_dir, "paddle-cpu", "fp32", threads=threads,
                                                             meta=meta),
                  "onnxruntime fp32": D.OnnxPredictor(model_dir, threads=threads, meta=meta)}
    if args.openvino:
        predictors["ppdlx paddle-cpu fp32 openvino"] = D.PaddlePredictor(
            model_dir, "paddle-cpu", "fp32", threads=threads, meta=meta, cpu_engine="openvino")
    if args.untuned:
        predictors["paddle-cpu fp32 untuned"] = D.PaddlePredictor(model_dir, "paddle-cpu", "fp32", threads=threads,
                                                                  meta=meta, tuned_cpu=False)
    load_before = os.getloadavg()
    started = time.time()
    rows = D.benchmark(predictors, meta, [], batch_sizes, args.warmup, args.repeats, synthetic=True)
    load_after = os.getloadavg()
    by_key = {(r["case"], r["batch_size"]): r for r in rows}
    for r in rows:
        ort = by_key.get(("onnxruntime fp32", r["batch_size"]))
        r["latency_vs_onnxruntime"] = r["latency_ms"]["mean"] / ort["latency_ms"]["mean"]
        r["mean_ms"], r["p50_ms"], r["p99_ms"] = (r["latency_ms"][k] for k in ("mean", "p50", "p99"))
    notes = [f"model: {cfg.model.name} {args.resolution}px, {cfg.model.num_classes} classes, random weights, "
             f"format {meta['model']['format']} ({meta['model']['model_file']}), ONNX from the same export "
             f"({'reused' if export['reused'] else 'exported in %.0f s' % export['seconds']})",
             f"threads per case: {threads}; cases interleaved batch by batch; warm-up {args.warmup}, "
             f"repeats {args.repeats}; {time.time() - started:.0f} s; load average {load_before[0]:.1f} -> "
             f"{load_after[0]:.1f} on {os.cpu_count()} cores"]
    for case, predictor in predictors.items():
        notes.append(f"{case}: " + "; ".join(predictor.plan["notes"]))
    for bs in batch_sizes:
        o = by_key[("onnxruntime fp32", bs)]
        for case in [c for c in predictors if c.startswith("ppdlx")]:
            p = by_key[(case, bs)]
            verdict = "<=" if p["latency_ms"]["mean"] <= o["latency_ms"]["mean"] else ">"
            notes.append(f"bs {bs}: {case} mean {p['latency_ms']['mean']:.1f} ms {verdict} onnxruntime "
                         f"{o['latency_ms']['mean']:.1f} ms (ratio {p['latency_vs_onnxruntime']:.3f}); "
                         f"p50 {p['latency_ms']['p50']:.1f} vs {o['latency_ms']['p50']:.1f}, "
                         f"p99 {p['latency_ms']['p99']:.1f} vs {o['latency_ms']['p99']:.1f}")
    return {"rows": rows, "notes": notes, "model_dir": os.path.abspath(model_dir)}
