"""A data-parallel training run for tests/engine/test_distributed.py, started by
``paddle.distributed.launch``: trains through ``ppdlx.engine.run.build_training`` and writes this rank's
final weights and statistics (``rank<N>.npz``) and counters (``rank<N>.json``) to OUT_DIR.

``--nan-on-rank1 CALLS``: rank 1's loss is NaN at those training batches (1-based, comma-separated; ``all``
= always), the way a bad batch on one device looks; the other ranks see finite losses.
``--node-local``: each rank's ``global.output_dir`` is the given one plus ``/node<rank>``, what ranks on
nodes with their own disks see of one path.
``--kill-rank1-at CALL``: rank 1 kills itself with SIGKILL at that training batch (1-based, counted from this
process's start), once per OUT_DIR (a marker file there): a rank lost mid-epoch, not again after a restart.
usage: dp_worker.py OUT_DIR CONFIG [--nan-on-rank1 CALLS] [--node-local] [--kill-rank1-at CALL] -o KEY=VALUE ...
"""
import argparse
import json
import os
import signal
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ppdlx.config import load_config  # noqa: E402
from ppdlx.engine.run import build_training  # noqa: E402
from ppdlx.errors import PpdlxError  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("config")
    parser.add_argument("--nan-on-rank1", default="")
    parser.add_argument("--node-local", action="store_true")
    parser.add_argument("--kill-rank1-at", type=int, default=0)
    parser.add_argument("-o", nargs="+", default=[])
    args = parser.parse_args()
    overrides = args.o
    if args.node_local:
        shared = next(o.split("=", 1)[1] for o in overrides if o.startswith("global.output_dir="))
        overrides += [f"global.output_dir={shared}/node{os.environ.get('PADDLE_TRAINER_ID', '0')}"]
    try:
        trainer = build_training(load_config(args.config, overrides))
    except PpdlxError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    if args.nan_on_rank1 and trainer.rank == 1:
        calls = None if args.nan_on_rank1 == "all" else {int(s) for s in args.nan_on_rank1.split(",")}
        objective = trainer.step.objective
        seen = []

        def poisoned(model, batch, epoch, step):
            loss, n = objective(model, batch, epoch, step)
            seen.append(step)
            return (loss * float("nan") if calls is None or len(seen) in calls else loss), n

        trainer.step.objective = poisoned
    marker = os.path.join(args.out_dir, "rank1.killed")
    if args.kill_rank1_at and trainer.rank == 1 and not os.path.exists(marker):
        objective, calls = trainer.step.objective, []

        def killed(model, batch, epoch, step):
            calls.append(step)
            if len(calls) == args.kill_rank1_at:
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            return objective(model, batch, epoch, step)

        trainer.step.objective = killed
    try:
        metrics = trainer.fit()
    except PpdlxError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    state = {k: v.numpy() for k, v in trainer.step.raw_model.state_dict().items()}
    np.savez(os.path.join(args.out_dir, f"rank{trainer.rank}.npz"), **state)
    with open(os.path.join(args.out_dir, f"rank{trainer.rank}.json"), "w") as f:
        json.dump({"skipped_steps": trainer.skipped_steps, "global_step": trainer.global_step,
                   "top1": metrics.get("top1"), "images": metrics.get("images")}, f)


if __name__ == "__main__":
    main()
