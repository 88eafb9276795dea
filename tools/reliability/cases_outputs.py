"""Where runs write (issue 15, item 5): an output directory or report path that cannot be written, two
trainings on one output directory, and a save that runs out of space."""
from __future__ import annotations

import os
import resource
import subprocess
import sys

from .battery import Case, Run
from .faults import (all_checkpoint_files, checkpoint_epoch, checkpoint_file, read_params,
                                      temporary_entries, write_text)
from .runners import second_training

AREA = "outputs"
# Below the size of one .pdparams of the tiny model: every checkpoint write fails with EFBIG, as on a full disk.
FILE_SIZE_LIMIT = 1 << 20


def _blocker(ctx):
    return write_text(ctx.path("blocker"), "a file where a directory is needed\n")


def _train_output_unwritable(ctx):
    out = os.path.join(_blocker(ctx), "out")
    return Run(ctx.train(out, epochs=1), mentions=["blocker"],
               description="global.output_dir under a regular file")


def _eval_report_unwritable(ctx):
    report = os.path.join(_blocker(ctx), "eval.json")
    weights = os.path.join(ctx.fx.get("run"), "latest")
    return Run(ctx.classification("tools/eval.py", f"model.weights={weights}", args=("--report", report)),
               mentions=["blocker"], description="eval --report under a regular file")


def _two_trainings(ctx):
    out = ctx.path("out")
    first = ctx.train(out, "train.steps_per_epoch=8", epochs=4)
    return Run(ctx.train(out, epochs=1), mentions=["out"], facts={"out": out, "first_argv": first},
               description="a second train.py on the output directory of one still training")


def _first_undisturbed(ctx, run, result):
    if run.facts.get("first_code") != 0:
        return f"the first training failed (exit {run.facts.get('first_code')}): {run.facts.get('first_tail')}"
    epoch = checkpoint_epoch(run.facts["out"], "latest")
    if epoch != 4:
        return f"the first training's latest records epoch {epoch}, not 4"
    return None


def _limit_file_size():
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))


def _disk_full(ctx):
    out = ctx.copy("run")
    protect = all_checkpoint_files(out)
    return Run(ctx.train(out, "train.resume=auto", epochs=3), protect=protect, mentions=[],
               preexec=_limit_file_size, facts={"out": out},
               description=f"resume to epoch 3 with files limited to {FILE_SIZE_LIMIT >> 20} MiB (writes fail with "
                           f"EFBIG, as on a full disk)")


def _left_clean(ctx, run, result):
    out = run.facts["out"]
    left = temporary_entries(out)
    if left:
        return f"left temporary files behind: {', '.join(left[:3])}"
    if checkpoint_epoch(out, "latest") != 2:
        return "latest no longer records epoch 2"
    read_params(checkpoint_file(out, "latest", "pdparams"))
    return None


def _link_to_another_run(ctx):
    other = ctx.copy("run", "other_run")
    link = ctx.path("mine")
    os.symlink(other, link)
    return Run(ctx.train(link, "train.resume=never", epochs=1), mentions=["other_run", "symbolic link"],
               protect=all_checkpoint_files(other),
               description="global.output_dir a symbolic link to another run's folder, train.resume=never")


def _inside_data(ctx):
    tree = ctx.copy("digits")
    return Run(ctx.train(os.path.join(tree, "train", "run"), data=tree, epochs=1), mentions=["data.root"],
               facts={"tree": tree}, description="global.output_dir inside data.root/train")


def _data_untouched(ctx, run, result):
    created = os.path.join(run.facts["tree"], "train", "run")
    return f"created {created} among the class folders" if os.path.exists(created) else None


def _stale_staging(ctx):
    """A copy of the export fixture holding the staging folder of an export that was killed (its pid has ended)."""
    model_dir = ctx.copy("export", "model")
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    stale = os.path.join(model_dir, f".export-staging-{ended.pid}-k1ll3d")
    os.makedirs(stale)
    write_text(os.path.join(stale, "inference.pdiparams"), "half of an export\n")
    return Run(ctx.export(os.path.join(ctx.fx.get("run"), "latest"), model_dir), facts={"stale": stale},
               description="export into a folder holding the staging folder of an export that was killed")


def _stale_removed(ctx, run, result):
    if os.path.exists(run.facts["stale"]):
        return False, f"exit 0, but {os.path.basename(run.facts['stale'])} was left behind"
    return True, "exit 0, the killed export's staging folder removed"


def cases():
    return [
        Case("train_output_dir_unwritable", AREA, "train.py", "", _train_output_unwritable),
        Case("eval_report_unwritable", AREA, "eval.py", "", _eval_report_unwritable),
        Case("two_trainings_one_output_dir", AREA, "train.py", "", _two_trainings, runner=second_training,
             after=_first_undisturbed, timeout=400),
        Case("disk_full_during_save", AREA, "train.py", "", _disk_full, after=_left_clean),
        Case("output_dir_link_to_another_run_resume_never", AREA, "train.py", "", _link_to_another_run),
        Case("export_after_a_killed_export", "export", "export_model.py", "", _stale_staging, expect="ok",
             check=_stale_removed),
        Case("output_dir_inside_data_root", AREA, "train.py", "", _inside_data, after=_data_untouched),
    ]
