"""A rank of tests/engine/test_static_distributed.py's weight-agreement test, started by
``paddle.distributed.launch``: builds a static-graph training run, checks that the ranks agree, then
moves one parameter on rank 1 only and checks again; writes what each check said to
``OUT_DIR/rank<N>.json``.
usage: static_sync_worker.py OUT_DIR CONFIG -o KEY=VALUE ...
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ppdlx.config import load_config  # noqa: E402
from ppdlx.dist import RanksDivergedError, rank  # noqa: E402
from ppdlx.engine.run import build_training  # noqa: E402


def check(step, when):
    try:
        step.check_in_sync(when)
        return "agree"
    except RanksDivergedError as err:
        return str(err)


def main(out_dir, config, overrides):
    trainer = build_training(load_config(config, overrides))
    step = trainer.step
    said = {"start": check(step, "at the start")}
    name = next(n for n, _ in step.pr.model.named_parameters())
    if rank() == 1:
        var = step.var_names[name]
        step.state.set(var, step.state.get(var) + 1.0)
    said["moved"] = check(step, "after one rank moved")
    said["parameter"] = name
    with open(os.path.join(out_dir, f"rank{rank()}.json"), "w") as f:
        json.dump(said, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[4:] if sys.argv[3:4] == ["-o"] else [])
