"""Checkpoint faults: kills during a save, damaged or missing checkpoints on resume, eval, export and
--check, another model's checkpoint, and a fresh start over a directory of checkpoints (issue 15,
items 1 and 2). The fixture run has ``latest``, ``best``, ``epoch_1`` and ``epoch_2`` (2 epochs)."""
from __future__ import annotations

import os

from .battery import Case, Run
from .faults import (all_checkpoint_files, checkpoint_epoch, checkpoint_file, checkpoint_files,
                                      checkpoint_unit, empty, garble, has_checkpoint, params_equal, remove_checkpoint,
                                      truncate)
from .runners import kill_during_save

AREA = "checkpoints"
DAMAGE = {"truncated": truncate, "garbled": garble, "empty": empty}


def _rel(ctx, path):
    return os.path.relpath(path, ctx.dir)


def _name_in_run(path, run_dir):
    return os.path.relpath(path, run_dir)


# ------------------------------------------------------------------------------------------ kill during save

def _kill_prepare(ctx):
    out = ctx.path("run")
    return Run(ctx.train(out, "train.resume=auto"), facts={"out": out, "first_argv": ctx.train(out)})


def _resumed_bit_identical(ctx, run, result):
    out = run.facts["out"]
    epoch = checkpoint_epoch(out, "latest")
    if epoch != 2:
        return False, f"after the resume, latest records epoch {epoch}, not 2"
    diff = params_equal(checkpoint_file(out, "latest", "pdparams"),
                        checkpoint_file(ctx.fx.get("run"), "latest", "pdparams"))
    if diff:
        return False, f"resumed run's final weights differ from an uninterrupted run's ({diff})"
    return True, "resumed from a complete checkpoint; final weights bit-identical to an uninterrupted run"


def _kill_case(nth):
    return Case(f"kill_during_save_{nth}", AREA, "train.py", f"SIGKILL the training when the temporary entry #{nth} "
                f"of its last save appears, then train.resume=auto", _kill_prepare, expect="ok",
                check=_resumed_bit_identical, runner=kill_during_save(nth), timeout=400)


# ------------------------------------------------------------------------------------------ resume=auto

def _fallback_prepare(damage):
    def prepare(ctx):
        out = ctx.copy("run")
        damaged = None
        if damage == "missing":
            remove_checkpoint(out, "latest")
            what = "deleted latest"
        else:
            path = checkpoint_file(out, "latest", damage[1])
            DAMAGE[damage[0]](path)
            damaged = checkpoint_unit(out, "latest")
            what = f"{damage[0]} {_name_in_run(path, out)}" + (f" (= {damaged})" if damaged != "latest" else "")
        remove_checkpoint(out, "best")
        intact = [n for n in ("epoch_2", "epoch_1") if n != damaged and has_checkpoint(out, n)]
        protect = [p for n in intact for p in checkpoint_files(out, n)]
        return Run(ctx.train(out, "train.resume=auto", epochs=3), protect=protect,
                   description=f"{what}; {', '.join(sorted(intact))} complete, best deleted; resume=auto with "
                               f"train.epochs=3", facts={"out": out, "fallback": intact[0]})
    return prepare


def _fell_back(ctx, run, result):
    out, fallback = run.facts["out"], run.facts["fallback"]
    if fallback not in result.output:
        return False, f"exit 0 without naming the checkpoint it resumed from ({fallback})"
    epoch = checkpoint_epoch(out, "latest")
    if epoch != 3:
        return False, f"latest records epoch {epoch} after training to epoch 3"
    return True, f"fell back to {fallback} (named) and trained to epoch 3"


def _fallback_case(name, damage):
    return Case(name, AREA, "train.py", "", _fallback_prepare(damage), expect="ok", check=_fell_back)


# ------------------------------------------------------------------------------------------ damaged files

def _damaged_prepare(kind, ext, tool):
    def prepare(ctx):
        out = ctx.copy("run")
        path = DAMAGE[kind](checkpoint_file(out, "latest", ext))
        protect = [p for p in all_checkpoint_files(out) if p != path]
        prefix = os.path.join(out, "latest")
        what = f"{kind} {_name_in_run(path, out)}"
        if tool == "resume":
            argv = ctx.train(out, f"train.resume={prefix}")
            what += f"; train.resume={os.path.basename(prefix)}"
        elif tool == "eval":
            argv = ctx.classification("tools/eval.py", f"model.weights={prefix}")
        elif tool == "export":
            argv = ctx.export(prefix, ctx.path("export"))
        elif tool == "prune_check":
            argv = ctx.tool("tools/prune_asp.py", "--check", prefix)
        elif tool == "infer":
            argv = ctx.classification("tools/infer.py", f"model.weights={prefix}", args=("--image", ctx.an_image()))
        elif tool == "quantize":
            argv = ctx.classification("tools/quantize.py", f"model.weights={prefix}", args=(
                "--calib-images", os.path.join(ctx.fx.get("digits"), "val"), "--output-dir", ctx.path("int8"),
                "--num-images", "8"))
        else:
            raise ValueError(tool)
        return Run(argv, mentions=[_name_in_run(path, out)], protect=protect, description=what)
    return prepare


def _damaged_case(tool, kind, ext, script):
    """A damaged checkpoint file: naming it is the fix (use another checkpoint), so no further fix is required."""
    return Case(f"{tool}_{kind}_{ext}", AREA, script, "", _damaged_prepare(kind, ext, tool),
                needs_fix=False)


# ------------------------------------------------------------------------------------------ other runs

def _fresh_prepare(ctx):
    out = ctx.copy("run")
    return Run(ctx.train(out), mentions=["train.resume"], protect=all_checkpoint_files(out),
               description="train without train.resume into a directory holding latest/best/epoch_N")


def _never_prepare(ctx):
    out = ctx.copy("run")
    return Run(ctx.train(out, "train.resume=never"), facts={"out": out},
               description="train.resume=never into a directory holding checkpoints (asked to start fresh)")


def _started_fresh(ctx, run, result):
    if "resumed from" in result.output:
        return False, "train.resume=never resumed"
    epoch = checkpoint_epoch(run.facts["out"], "latest")
    return (epoch == 2), f"trained from scratch to epoch {epoch}"


def _other_model_prepare(with_opt):
    def prepare(ctx):
        out = ctx.copy("run")
        if not with_opt:
            os.remove(checkpoint_file(out, "latest", "pdopt"))
        return Run(ctx.train(out, "train.resume=auto", "model.name=resnet50"),
                   mentions=["resnet18_bottleneck_tiny"], protect=all_checkpoint_files(out),
                   description="train.resume=auto with model.name=resnet50 over a resnet18_bottleneck_tiny run "
                               f"({'with' if with_opt else 'without'} latest's .pdopt)")
    return prepare


def _eval_other_model(ctx):
    prefix = os.path.join(ctx.fx.get("run"), "latest")
    return Run(ctx.classification("tools/eval.py", f"model.weights={prefix}", "model.name=resnet50"),
               mentions=["shape"],
               description="eval with model.name=resnet50 and a resnet18_bottleneck_tiny checkpoint")


def cases():
    return [
        _kill_case(1), _kill_case(2), _kill_case(3), _kill_case(4),
        _fallback_case("resume_auto_latest_garbled", ("garbled", "pdparams")),
        _fallback_case("resume_auto_latest_states_truncated", ("truncated", "pdstates")),
        _fallback_case("resume_auto_latest_missing", "missing"),
        Case("fresh_start_over_checkpoints", AREA, "train.py", "", _fresh_prepare),
        Case("resume_never_over_checkpoints", AREA, "train.py", "", _never_prepare, expect="ok",
             check=_started_fresh),
        _damaged_case("resume", "truncated", "pdparams", "train.py"),
        _damaged_case("resume", "garbled", "pdopt", "train.py"),
        _damaged_case("resume", "truncated", "pdstates", "train.py"),
        Case("resume_other_model_with_pdopt", AREA, "train.py", "", _other_model_prepare(True)),
        Case("resume_other_model_without_pdopt", AREA, "train.py", "", _other_model_prepare(False)),
        _damaged_case("eval", "truncated", "pdparams", "eval.py"),
        _damaged_case("eval", "empty", "pdparams", "eval.py"),
        Case("eval_other_model", AREA, "eval.py", "", _eval_other_model),
        _damaged_case("export", "truncated", "pdparams", "export_model.py"),
        _damaged_case("prune_check", "garbled", "pdparams", "prune_asp.py --check"),
        _damaged_case("infer", "truncated", "pdparams", "infer.py"),
        _damaged_case("quantize", "truncated", "pdparams", "quantize.py"),
    ]
