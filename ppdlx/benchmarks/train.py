"""Training speed: ppdlx's trainer vs a bare Paddle loop on the same synthetic batch.

Cases are measured in interleaved rounds inside one process so that machine noise
hits them alike; img/s = images / wall time over the measured steps (warm-up
excluded). Extra cases plug in through ``EXTRA_CASES`` (name -> module:function).
"""
from __future__ import annotations

import importlib
import logging
import time

import numpy as np
import paddle
import paddle.nn.functional as F

EXTRA_CASES = {
    "graph_modes": "ppdlx.benchmarks.graph_modes:graph_mode_rows",
    "asp": "ppdlx.benchmarks.train_asp:asp_overhead",
    "torch": "ppdlx.benchmarks.torch_compare:torch_rows",
}


def add_arguments(parser):
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("-o", "--override", action="append", nargs="+", default=[])
    parser.add_argument("--steps", type=int, default=20, help="measured steps per case")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured steps per case")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved measuring rounds")
    parser.add_argument("--cases", default="ppdlx,bare",
                        help=f"comma list of ppdlx, bare and extra cases ({', '.join(EXTRA_CASES)})")
    parser.add_argument("--compare-torch", action="store_true", help="add the PyTorch case (needs torch)")


class _BareLoop:
    """The minimum a user would write: model, Momentum, cross-entropy, backward, step."""

    def __init__(self, cfg, images, labels):
        from ppdlx.engine.builders import build_model
        self.model = build_model(cfg)
        self.model.train()
        self.opt = paddle.optimizer.Momentum(learning_rate=0.01, momentum=0.875,
                                             parameters=self.model.parameters(), weight_decay=cfg.optimizer.weight_decay)
        self.images, self.labels = images, labels

    def run(self, steps):
        loss = None
        for _ in range(steps):
            loss = F.cross_entropy(self.model(self.images), self.labels, label_smoothing=0.1)
            loss.backward()
            self.opt.step()
            self.opt.clear_grad()
        if loss is not None:
            float(loss)  # wait for the last step


class _Trainer:
    def __init__(self, cfg):
        from ppdlx.engine.run import build_training
        self.trainer = build_training(cfg)
        self.loader = self.trainer.train_loader
        logging.getLogger("ppdlx").setLevel(logging.WARNING)

    def run(self, steps):
        self.loader.steps = steps
        self.trainer.steps_per_epoch = steps
        self.trainer.train_one_epoch()


def _time(runner, steps):
    start = time.perf_counter()
    runner.run(steps)
    return time.perf_counter() - start


def measure(cfg, steps, warmup, rounds, cases=("ppdlx", "bare")):
    batch = cfg.data.batch_size
    runners = {}
    if "ppdlx" in cases:
        runners["ppdlx"] = _Trainer(cfg)
    if "bare" in cases:
        loader = runners["ppdlx"].loader if "ppdlx" in runners else None
        if loader is None:
            from ppdlx.data.loader import SyntheticLoader
            loader = SyntheticLoader(batch, batch, cfg.model.num_classes, cfg.data.transforms.crop_size,
                                     cfg.model.data_format, cfg.global_.seed)
        runners["bare"] = _BareLoop(cfg, loader.images, loader.labels)
    for runner in runners.values():
        runner.run(warmup)
    seconds = {name: 0.0 for name in runners}
    per_round = max(1, steps // rounds)
    for _ in range(rounds):
        for name, runner in runners.items():
            seconds[name] += _time(runner, per_round)
    measured = per_round * rounds
    rows = [{"case": name, "images_per_s": measured * batch / secs, "batch_size": batch, "steps": measured,
             "seconds": secs} for name, secs in seconds.items()]
    if "ppdlx" in seconds and "bare" in seconds:
        rows[0]["ratio_vs_bare"] = seconds["bare"] / seconds["ppdlx"]
    return rows


def run(args):
    from ppdlx.config import flatten_overrides, load_config
    overrides = ["data.backend=synthetic", "global.log_interval=1000000", "ema.enabled=false",
                 *flatten_overrides(args.override)]
    cfg = load_config(args.config, overrides)
    cfg.global_.output_dir = cfg.global_.output_dir.rstrip("/") + "_benchmark"
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if args.compare_torch and "torch" not in cases:
        cases.append("torch")
    rows = measure(cfg, args.steps, args.warmup, args.rounds, [c for c in cases if c in ("ppdlx", "bare")])
    notes = [f"config {args.config}; model {cfg.model.name} {cfg.model.data_format}; batch {cfg.data.batch_size} "
             f"at {cfg.data.transforms.crop_size} px; {args.steps} steps in {args.rounds} interleaved rounds"]
    for case in cases:
        if case in ("ppdlx", "bare"):
            continue
        if case not in EXTRA_CASES:
            raise SystemExit(f"error: unknown benchmark case '{case}' (known: ppdlx, bare, {', '.join(EXTRA_CASES)})")
        module_name, fn_name = EXTRA_CASES[case].split(":")
        fn = getattr(importlib.import_module(module_name), fn_name)
        rows.extend(fn(cfg, args.steps, args.warmup))
    return {"rows": rows, "notes": notes}
