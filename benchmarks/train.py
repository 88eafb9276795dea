"""Training speed: ppdlx's trainer vs a bare Paddle loop on the same synthetic batch.

Cases are measured in interleaved rounds inside one process so that machine noise
hits them alike; img/s = images / wall time over the measured steps (warm-up
excluded). Extra cases plug in through ``EXTRA_CASES`` (name -> module:function).
"""
from __future__ import annotations

import importlib
import logging
import os
import re
import time
from typing import Optional

import paddle
import paddle.nn.functional as F

from benchmarks import add_config_and_steps

EXTRA_CASES = {
    "graph_modes": "benchmarks.graph_modes:graph_mode_rows",
    "asp": "benchmarks.train_asp:asp_overhead",
}


def add_arguments(parser):
    add_config_and_steps(parser, 20, "measured steps per case", 3, "unmeasured steps per case")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved measuring rounds")
    parser.add_argument("--cases", default="ppdlx,bare",
                        help=f"comma list of ppdlx, ppdlx-fp32 (AMP off), bare, torch and extra cases "
                             f"({', '.join(EXTRA_CASES)})")
    parser.add_argument("--compare-torch", action="store_true", help="add the PyTorch cases (needs torch)")
    parser.add_argument("--torch-bf16-scale", type=float, default=0.25,
                        help="steps of the PyTorch bf16 case relative to the others (it is ~15x slower on CPUs "
                             "without avx512_bf16/AMX); 0 = skip it")


def _torch_runners(cfg, args, runners):
    from benchmarks import torch_compare
    if not torch_compare.torch_available():
        raise SystemExit("error: --compare-torch needs PyTorch (pip install torch==2.13.0, the CPU build)")
    from ppdlx.dist import configure_cpu_threads
    worker = torch_compare.TorchWorker(cfg.data.batch_size, cfg.data.transforms.crop_size, cfg.model.num_classes,
                                       configure_cpu_threads(cfg.global_.cpu_threads))
    for case, (dtype, _) in torch_compare.VARIANTS.items():
        scale = args.torch_bf16_scale if dtype == "bfloat16" else 1.0
        if scale > 0:
            runners[case] = torch_compare.TorchCase(worker, case, scale)
    return worker


class _BareLoop:
    """The minimum a user would write: model, Momentum, cross-entropy, backward, step."""

    def __init__(self, cfg, images, labels):
        from ppdlx.models.from_config import build_model
        self.model = build_model(cfg)
        self.model.train()
        self.opt = paddle.optimizer.Momentum(learning_rate=0.01, momentum=0.875, parameters=self.model.parameters(),
                                             weight_decay=cfg.optimizer.weight_decay)
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


def settle_seconds(environ=os.environ) -> Optional[float]:
    """The pause before each timed case. The OpenMP runtime in Paddle's wheel (libiomp5) keeps its
    worker threads spinning for ``KMP_BLOCKTIME`` (200 ms unless set) after the last parallel region,
    so without a pause the case that follows ppdlx in a round starts on a core still busy with
    ppdlx's spinning thread (PyTorch's libgomp pool spins for a few ms only). 0 where the pool
    sleeps at once; None where it spins for ever (``infinite``, ``OMP_WAIT_POLICY=active``), which
    no pause settles."""
    blocktime = environ.get("KMP_BLOCKTIME", "").strip().lower()
    policy = environ.get("OMP_WAIT_POLICY", "").strip().lower()
    if blocktime == "infinite" or (not blocktime and policy == "active"):
        return None
    if not blocktime:
        return 0.0 if policy == "passive" else 0.3
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(us|ms|s)?", blocktime)
    if match is None:  # libiomp warns and keeps its default
        return 0.3
    seconds = float(match.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[match.group(2) or "ms"]
    return seconds + 0.1 if seconds > 0 else 0.0


def _time(runner, steps, settle=0.0):
    if settle:
        time.sleep(settle)
    start = time.perf_counter()
    own = runner.run(steps)
    end = time.perf_counter()
    return (own if isinstance(own, float) else end - start), start, end


def measure(cfg, steps, warmup, rounds, cases=("ppdlx", "bare"), extra_runners=None, layout=None, order_out=None,
            plans_out=None):
    """img/s of each case over ``steps`` measured steps split into ``rounds`` interleaved rounds.
    ``extra_runners``: name -> runner with ``run(steps)`` and an optional ``steps_scale`` (slow
    cases run fewer steps per round); ``layout``: a list the ppdlx case's data layout is appended to
    (its run plan may pick another than the config's on CPU; the bare loop uses the config's);
    ``order_out``: a list every timed run is appended to (round, case, start and end on the
    ``time.perf_counter`` clock); ``plans_out``: a list each ppdlx case's run plan line is appended
    to. Each timed run starts after :func:`settle_seconds`."""
    batch = cfg.data.batch_size
    bare_cfg = cfg
    runners = {}
    if "ppdlx" in cases:
        runners["ppdlx"] = _Trainer(cfg)
        if layout is not None:
            layout.append(runners["ppdlx"].trainer.plan.data_format)
    if "ppdlx-fp32" in cases:  # the same trainer with AMP off: what bf16 buys where the plan uses it
        runners["ppdlx-fp32"] = _Trainer(cfg.replace({
            "amp.enabled": False, "global.output_dir": cfg.global_.output_dir.rstrip("/") + "_fp32"}))
    if plans_out is not None:
        plans_out.extend(f"{name}: {runners[name].trainer.plan.line()}" for name in ("ppdlx", "ppdlx-fp32")
                         if name in runners)
    if "bare" in cases:
        from ppdlx.data.loader import SyntheticLoader
        loader = SyntheticLoader(batch, batch, bare_cfg.model.num_classes, bare_cfg.data.transforms.crop_size,
                                 bare_cfg.model.data_format, bare_cfg.global_.seed)
        runners["bare"] = _BareLoop(bare_cfg, loader.images, loader.labels)
    runners.update(extra_runners or {})
    per_round = max(1, steps // rounds)
    steps_of = {name: max(1, round(per_round * getattr(r, "steps_scale", 1.0))) for name, r in runners.items()}
    for name, runner in runners.items():
        runner.run(max(1, round(warmup * getattr(runner, "steps_scale", 1.0))) if warmup else 0)
    round_seconds = {name: [] for name in runners}
    names = list(runners)
    settle = settle_seconds() or 0.0
    order = []
    for r in range(rounds):
        # every other round runs the cases in reverse order: no case always follows the same one
        for name in names if r % 2 == 0 else names[::-1]:
            seconds, start, end = _time(runners[name], steps_of[name], settle)
            round_seconds[name].append(seconds)
            order.append({"round": r, "case": name, "start": start, "end": end})
    rows = []
    for name, secs in round_seconds.items():
        rows.append({"case": name, "images_per_s": steps_of[name] * rounds * batch / sum(secs), "batch_size": batch,
                     "steps": steps_of[name] * rounds, "seconds": sum(secs), "settle_s": settle,
                     "images_per_s_per_round": [steps_of[name] * batch / s for s in secs]})
    by_name = {row["case"]: row for row in rows}
    if "ppdlx" in by_name:
        mine = by_name["ppdlx"]["images_per_s_per_round"]
        for row in rows:
            if row["case"] != "ppdlx":
                row["ppdlx_vs_this"] = by_name["ppdlx"]["images_per_s"] / row["images_per_s"]
                row.update(_per_round_ratios(mine, row["images_per_s_per_round"]))
    if order_out is not None:
        order_out.extend(order)
    return rows


def _per_round_ratios(mine, other) -> dict:
    """Round r of ppdlx over round r of the other case (within a round both saw nearly the same
    machine: the comparison that survives a machine shared with other work) and their spread, by the
    inference benchmark's rule (``ppdlx_deploy.ratio_stats``), under this report's keys."""
    from benchmarks.infer import load_deploy_module
    stats = load_deploy_module().ratio_stats(mine, other)
    return {"ratio_median": stats["median"], "ratio_min": stats["min"], "ratio_max": stats["max"],
            "ratios_per_round": sorted(stats["per_round"])}


def ratio_to_best(rows, prefix="torch", mine="ppdlx"):
    """ppdlx against the fastest ``prefix*`` case of each round (PyTorch's best mode is whichever of
    its modes won that round): the median, range and per-round values, or None without such cases."""
    by_name = {row["case"]: row for row in rows}
    others = [row["images_per_s_per_round"] for row in rows if row["case"].startswith(prefix)]
    if mine not in by_name or not others:
        return None
    best = [max(per_round) for per_round in zip(*others)]
    return {**_per_round_ratios(by_name[mine]["images_per_s_per_round"], best),
            "best_images_per_s_per_round": best}


def run(args):
    from ppdlx.config import flatten_overrides, load_config
    from ppdlx.dist import resolve_device
    from ppdlx.tasks.preprocess import resolve_preprocessing
    from ppdlx.errors import ConfigError
    overrides = ["data.backend=synthetic", "global.log_interval=1000000", "ema.enabled=false",
                 *flatten_overrides(args.override)]
    cfg = resolve_preprocessing(load_config(args.config, overrides))  # the bare loop reads its crop size
    cfg = cfg.replace({"global.output_dir": cfg.global_.output_dir.rstrip("/") + "_benchmark"})
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if args.compare_torch and "torch" not in cases:
        cases.append("torch")
    device = resolve_device(cfg.global_.device)
    if "torch" in cases and device != "cpu":
        raise ConfigError(f"--compare-torch runs PyTorch on CPU, and ppdlx would train on {device} "
                          f"(global.device={cfg.global_.device}): add -o global.device=cpu to compare the two "
                          f"on this CPU")
    extra_runners, worker = {}, None
    if "torch" in cases:
        worker = _torch_runners(cfg, args, extra_runners)
    layout, order, amp_plans = [], [], []
    try:
        rows = measure(cfg, args.steps, args.warmup, args.rounds,
                       [c for c in cases if c in ("ppdlx", "ppdlx-fp32", "bare")],
                       extra_runners, layout, order, amp_plans)
    finally:
        if worker is not None:
            worker.close()
    from ppdlx.dist import configure_cpu_threads
    trained_in = layout[0] if layout else cfg.model.data_format
    notes = [f"config {args.config}; model {cfg.model.name} (ppdlx trained it in {trained_in}); batch "
             f"{cfg.data.batch_size} at {cfg.data.transforms.crop_size} px; {args.steps} steps in {args.rounds} "
             f"interleaved rounds; {configure_cpu_threads(cfg.global_.cpu_threads)} CPU threads; "
             f"MKL_DEBUG_CPU_TYPE={os.environ.get('MKL_DEBUG_CPU_TYPE')}"]
    notes += amp_plans
    settle = settle_seconds()
    notes.append(f"each timed run starts {settle:.2f} s after the previous one ends (OpenMP threads of the previous "
                 f"case spin for KMP_BLOCKTIME)" if settle is not None else
                 "KMP_BLOCKTIME=infinite / OMP_WAIT_POLICY=active: the previous case's OpenMP threads never stop "
                 "spinning, so each case shares the cores with them; unset it for a fair comparison")
    if worker is not None:
        notes.append(f"PyTorch {worker.facts.get('torch')} in a worker process, {worker.facts.get('torch_threads')} "
                     f"threads; bf16 cases run {args.torch_bf16_scale:g}x the steps of the others")
    def ratio_note(of, r):
        return (f"ppdlx / {of} = {r['ratio_median']:.3f} (median of {args.rounds} rounds; range "
                f"{r['ratio_min']:.3f}-{r['ratio_max']:.3f})")
    notes += [ratio_note(row["case"], row) for row in rows if "ratio_median" in row]
    best = ratio_to_best(rows)
    if best is not None:
        notes.append(ratio_note("PyTorch best (fastest PyTorch mode of each round)", best))
    best_fp32 = ratio_to_best(rows, mine="ppdlx-fp32")
    if best_fp32 is not None:
        notes.append(ratio_note("PyTorch best", best_fp32).replace("ppdlx /", "ppdlx-fp32 /", 1))
    for case in cases:
        if case in ("ppdlx", "ppdlx-fp32", "bare", "torch"):
            continue
        if case not in EXTRA_CASES:
            raise SystemExit(f"error: unknown benchmark case '{case}' (known: ppdlx, ppdlx-fp32, bare, torch, "
                             f"{', '.join(EXTRA_CASES)})")
        module_name, fn_name = EXTRA_CASES[case].split(":")
        fn = getattr(importlib.import_module(module_name), fn_name)
        rows.extend(fn(cfg, args.steps, args.warmup))
    return {"rows": rows, "notes": notes, "ppdlx_vs_torch_best": best, "ppdlx_fp32_vs_torch_best": best_fp32,
            "order": order}
