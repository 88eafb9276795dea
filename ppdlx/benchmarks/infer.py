"""Inference speed: ppdlx's deploy predictor (Paddle Inference, CPU) vs onnxruntime on the same export.

Exports the configured classifier (ResNet50 at 224 by default; random weights are fine for
speed) with ``--onnx``, loads ``deploy/python/infer.py`` by file path (deploy/ does not import
ppdlx, and ppdlx does not import deploy/ as a package), builds its predictors and times the
network call (input copy + run + output copy) with the cases interleaved batch by batch, so the
load of other processes on this shared machine hits every case alike. Latency percentiles are
true percentiles (numpy.percentile) of per-batch times, warm-up excluded.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import time

from ppdlx.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY_INFER = os.path.join(ROOT, "deploy", "python", "infer.py")


def load_deploy_module(path: str = DEPLOY_INFER):
    """Import deploy/python/infer.py by file path (cached in sys.modules)."""
    name = "ppdlx_deploy_infer"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
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
    overrides = list(flatten_overrides(args.override)) + [f"data.transforms.crop_size={args.resolution}",
                                                          f"data.transforms.resize_short={int(args.resolution * 8 / 7)}"]
    cfg = load_config(args.config, overrides)
    if cfg.model.name.startswith("efficientdet"):
        raise ConfigError("benchmark infer: classification models only (model.name=%s)" % cfg.model.name)
    batch_sizes = [int(b) for b in str(args.batch_sizes).split(",") if b]
    model_dir = args.model_dir or os.path.join(cfg.global_cfg.output_dir, "bench_infer")
    export = _ensure_export(cfg, model_dir, args.format, args.reexport)

    D = load_deploy_module()
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
