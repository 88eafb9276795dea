"""Training img/s in the three graph modes (dynamic, to_static, static) on one synthetic batch.

    python -m benchmarks.graph_modes -c configs/demo/rn50_demo.yaml --steps 10

Each case is a real trainer built from the same config (``data.backend=synthetic``: one fixed
random batch, so input cost is nil and every mode sees the same tensors): the ``Trainer`` with
the dynamic step (``train.graph=dynamic`` / ``to_static``) or the static program step. After
``warmup`` untimed optimizer steps per case (tracing, program building, allocator warm-up),
the cases are timed interleaved, ``repeats`` times ``steps`` optimizer steps each, and the
median is reported: this machine is shared and noisy, so ratios within one run are what count.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import statistics
import tempfile
import time

CASES = ("dynamic", "to_static", "static")


@contextlib.contextmanager
def _quiet():
    """Progress lines off while measuring (trainers' setup_logging re-enables INFO: see _build)."""
    logger = logging.getLogger("ppdlx")
    level = logger.level
    try:
        yield
    finally:
        logger.setLevel(level)


def _case_config(cfg, case: str, out_dir: str, n_steps: int):
    return cfg.replace({"train.graph": case, "data.backend": "synthetic", "train.epochs": 1, "train.resume": None,
                        "data.synthetic.num_images": cfg.data.batch_size * cfg.train.accumulate * max(n_steps, 1),
                        "ema.enabled": False, "global.output_dir": os.path.join(out_dir, case),
                        "global.log_interval": 10 ** 6})


def _build(cfg):
    from ppdlx.engine.run import build_training
    trainer = build_training(cfg)
    logging.getLogger("ppdlx").setLevel(logging.WARNING)
    return trainer


def _timed_steps(trainer, steps: int):
    """(wall seconds, process CPU seconds) for ``steps`` optimizer steps (one ``train_one_epoch``
    capped at ``steps``). CPU time is the steadier number on a shared machine: it does not count
    the time other processes hold the cores."""
    trainer.steps_per_epoch = steps
    wall, cpu = time.perf_counter(), time.process_time()
    trainer.train_one_epoch()
    return time.perf_counter() - wall, time.process_time() - cpu


def graph_mode_rows(cfg, steps: int, warmup: int, repeats: int = 3, cases=CASES) -> list:
    """``[{"case": "dynamic"|"to_static"|"static", "images_per_s": float, ...}]`` for ``cfg``,
    measured in this process on the same synthetic batch (see the module docstring)."""
    steps, warmup, repeats = max(1, int(steps)), max(0, int(warmup)), max(1, int(repeats))
    trainers = {}
    times = {case: [] for case in cases}
    with tempfile.TemporaryDirectory(prefix="ppdlx_graph_modes_") as out_dir, _quiet():
        for case in cases:
            c = _case_config(cfg, case, out_dir, max(steps, warmup))
            trainer = _build(c)
            if warmup:
                _timed_steps(trainer, warmup)
            trainers[case] = trainer
        for _ in range(repeats):
            for case in cases:
                times[case].append(_timed_steps(trainers[case], steps))
        for trainer in trainers.values():
            trainer.call_hooks("after_train")
    rows = []
    for case in cases:
        t = trainers[case]
        images = steps * t.accumulate * cfg.data.batch_size
        per_run = [images / wall for wall, _ in times[case]]
        rows.append({"case": case, "images_per_s": statistics.median(per_run),
                     "min_images_per_s": min(per_run), "max_images_per_s": max(per_run),
                     "ms_per_step": 1000.0 * statistics.median(w for w, _ in times[case]) / steps,
                     "cpu_ms_per_step": 1000.0 * statistics.median(c for _, c in times[case]) / steps,
                     "batch": cfg.data.batch_size, "crop": cfg.data.transforms.crop_size,
                     "model": cfg.model.name, "steps": steps, "repeats": repeats})
    fastest = max(rows, key=lambda r: r["images_per_s"])
    for r in rows:
        r["vs_fastest"] = r["images_per_s"] / fastest["images_per_s"]
    return rows


def main(argv=None):
    import json
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if root not in sys.path:
        sys.path.insert(0, root)
    import ppdlx  # noqa: F401  (MKL_DEBUG_CPU_TYPE before paddle)
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("-o", "--override", action="append", nargs="+", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps per case and repeat")
    parser.add_argument("--warmup", type=int, default=3, help="untimed optimizer steps per case first")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved measurements per case (median)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of " + ",".join(CASES))
    parser.add_argument("--report", help="write a JSON report here")
    args = parser.parse_args(argv)
    from benchmarks import format_table, machine_facts
    from ppdlx.config import flatten_overrides, load_config
    from ppdlx.errors import PpdlxError
    try:
        from ppdlx.tasks.preprocess import resolve_preprocessing
        cfg = resolve_preprocessing(load_config(args.config, flatten_overrides(args.override)))
        rows = graph_mode_rows(cfg, args.steps, args.warmup, args.repeats,
                               tuple(c.strip() for c in args.cases.split(",") if c.strip()))
    except PpdlxError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    print(format_table(rows))
    if args.report:
        os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
        with open(args.report, "w", encoding="utf-8") as f:
            json.dump({"machine": machine_facts(), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
