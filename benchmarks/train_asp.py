"""ASP fine-tune step overhead vs dense training, measured in one run.

One trainer (the config's model, optimizer, AMP, EMA, accumulation) on synthetic data;
dense and ASP steps alternate in ABBA order (dense, asp, asp, dense, ...) so drift and
neighbours' load hit both cases alike. An ASP step is the same step plus
``ASPHook.after_step`` (in-place multiply of every pruned weight by its
precomputed mask). Reported: images/s per case, the overhead from paired step-time
differences, and the directly timed mask cost per step relative to a dense step.

    python -m benchmarks.train_asp -c configs/demo/rn50_asp_demo.yaml --steps 20 --report asp.json
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import paddle


def add_arguments(parser) -> None:
    parser.add_argument("-c", "--config", required=True, help="YAML config (its asp section sets n:m etc.)")
    parser.add_argument("-o", "--override", action="append", nargs="+", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=20, help="measured optimizer steps per case")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured steps per case first")


class _TimedHook:
    """Wraps ASPHook.after_step and records its wall time."""

    def __init__(self, hook):
        self.hook, self.name, self.times = hook, hook.name, []

    def after_step(self):
        wait_for_device()
        start = time.perf_counter()
        self.hook.after_step()
        wait_for_device()  # on a GPU the masking is queued: timed without this, only its launch is
        self.times.append(time.perf_counter() - start)


def wait_for_device() -> None:
    if paddle.get_device().startswith("gpu"):  # CPU ops have finished when they return
        paddle.device.synchronize()


def _prepare(cfg, output_dir):
    return cfg.replace({"global.output_dir": output_dir, "model.weights": None, "train.resume": None,
                        "data.backend": "synthetic", "data.synthetic.num_images": max(
                            cfg.data.synthetic.num_images, cfg.data.batch_size * cfg.train.accumulate)})


def asp_overhead(cfg, steps: int = 20, warmup: int = 2) -> list:
    """Rows ``{"case": "dense" | "asp", "images_per_s", "step_ms", ...}``; the asp row
    carries ``overhead_pct`` (paired step-time difference) and ``mask_overhead_pct``."""
    from ppdlx.engine.hooks import EMA, LRScheduler
    from ppdlx.engine.run import build_training
    from ppdlx.sparsity import ASPHook

    with tempfile.TemporaryDirectory(prefix="ppdlx_asp_bench_") as tmp:
        cfg = _prepare(cfg, tmp)
        trainer = build_training(cfg, hooks=())
        hook = ASPHook.from_config(cfg.asp)
        hook.trainer = trainer
        hook.attach_to(trainer.step.weights())
        timed = _TimedHook(hook)
        batch = next(iter(trainer.train_loader))
        images = int(batch[0].shape[0]) * trainer.accumulate
        trainer.step.train_mode()
        lr_hook, ema_hook = trainer.find_hook(LRScheduler), trainer.find_hook(EMA)

        def step(with_asp: bool) -> float:
            start = time.perf_counter()
            for micro in range(trainer.accumulate):
                result = trainer.step.run(batch, micro == trainer.accumulate - 1)
            trainer.result = result
            trainer.global_step += int(result.applied)
            # the trainer's after-step order: LR schedule, the ASP hook, the EMA
            for h in [lr_hook, timed if with_asp else None, ema_hook]:
                if h is not None:
                    h.after_step()
            float(result.loss)  # make sure the step finished (asynchronous devices)
            return time.perf_counter() - start

        for _ in range(warmup):
            step(False)
            step(True)
        timed.times.clear()
        dense, asp = [], []
        for i in range(steps):
            order = (False, True) if i % 2 == 0 else (True, False)
            for with_asp in order:
                (asp if with_asp else dense).append(step(with_asp))
        trainer.call_hooks("after_train")
    med_dense = statistics.median(dense)
    paired = statistics.median(a - d for a, d in zip(asp, dense))
    mask = statistics.median(timed.times)
    rows = [{"case": "dense", "images_per_s": images * len(dense) / sum(dense), "step_ms": 1000 * med_dense,
             "steps": len(dense), "step_ms_all": [round(1000 * t, 2) for t in dense]},
            {"case": "asp", "images_per_s": images * len(asp) / sum(asp), "step_ms": 1000 * statistics.median(asp),
             "steps": len(asp), "overhead_pct": 100.0 * paired / med_dense, "mask_ms": 1000 * mask,
             "mask_overhead_pct": 100.0 * mask / med_dense, "step_ms_all": [round(1000 * t, 2) for t in asp],
             "mask_ms_all": [round(1000 * t, 3) for t in timed.times]}]
    return rows


def run(args) -> dict:
    from ppdlx.config import flatten_overrides, load_config
    from ppdlx.tasks.preprocess import resolve_preprocessing
    cfg = resolve_preprocessing(load_config(args.config, flatten_overrides(args.override)))
    rows = asp_overhead(cfg, args.steps, args.warmup)
    asp = rows[1]
    notes = [f"ASP step overhead vs dense: {asp['overhead_pct']:+.2f}% (median of {asp['steps']} paired ABBA step "
             f"differences; target <= 3%); mask application alone {asp['mask_ms']:.1f} ms/step = "
             f"{asp['mask_overhead_pct']:.2f}% of a dense step ({cfg.model.name}, batch {cfg.data.batch_size} x "
             f"{cfg.train.accumulate}, {cfg.data.transforms.crop_size} px, {cfg.asp.n}:{cfg.asp.m})"]
    return {"rows": rows, "notes": notes, "config": args.config, "steps": args.steps}


def main(argv=None) -> int:
    import ppdlx  # noqa: F401  (MKL_DEBUG_CPU_TYPE before paddle)
    from benchmarks import format_table, machine_facts
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.add_argument("--report", help="write the JSON report here")
    args = parser.parse_args(argv)
    result = run(args)
    report = {"machine": machine_facts(), **result}
    print(format_table(report["rows"]))
    for line in report["notes"]:
        print(line)
    if args.report:
        import json
        import os
        os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
        with open(args.report, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    import sys
    from ppdlx.errors import PpdlxError
    try:
        sys.exit(main())
    except PpdlxError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
