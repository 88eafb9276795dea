"""Bad image-folder data and bad configs (issue 15, item 4): zero-byte and unreadable JPEGs through DALI
and paddle.io, empty or image-less class folders, val splits that differ from train, a missing root,
duplicate / unknown / mistyped keys and broken ``-o``."""
from __future__ import annotations

import glob
import os
import re
import shutil

from .battery import Case, Run
from .faults import empty, garble, write_text
from .workspace import CLASSIFICATION_CONFIG

DATA, CONFIG = "data", "config"
WHOLE_EPOCH = "train.steps_per_epoch=null"  # every file is read once: the faulty one cannot be missed


def _images(folder):
    return sorted(glob.glob(os.path.join(folder, "*.jpg")))


def _zero_byte(ctx, tree):
    """Empty the second image of train/3; returns (its path, the valid image before it)."""
    images = _images(os.path.join(tree, "train", "3"))
    return empty(images[1]), images[0]


def _named_not_neighbour(ctx, run, result):
    """The problem when the output blames the valid neighbour instead of the bad file."""
    neighbour = run.facts.get("neighbour")
    if neighbour and os.path.basename(neighbour) in result.output:
        return f"names the valid file {os.path.basename(neighbour)}"
    return None


def _output_names(key):
    def check(ctx, run, result):
        wanted = run.facts[key]
        if wanted in result.output:
            return True, f"exit 0, {wanted} named in the output"
        return False, f"exit 0 without naming {wanted}"
    return check


def _zero_byte_prepare(backend, policy):
    def prepare(ctx):
        tree = ctx.copy("digits")
        bad, neighbour = _zero_byte(ctx, tree)
        overrides = [f"data.backend={backend}", WHOLE_EPOCH]
        if policy:
            overrides.append(f"data.dali.corrupt_files={policy}")
        return Run(ctx.train(ctx.path("out"), *overrides, data=tree, epochs=1), mentions=[os.path.basename(bad)],
                   description=f"zero-byte train/3/{os.path.basename(bad)}; data.backend={backend}"
                   + (f", data.dali.corrupt_files={policy}" if policy else ""),
                   facts={"bad": os.path.basename(bad), "neighbour": neighbour})
    return prepare


def _rename_class(tree, old, new):
    for split in ("train", "val"):
        os.rename(os.path.join(tree, split, old), os.path.join(tree, split, new))


def _class_folder_prepare(kind):
    def prepare(ctx):
        tree = ctx.copy("digits")
        _rename_class(tree, "3", "three")
        folder = os.path.join(tree, "train", "three")
        for path in _images(folder):
            os.remove(path)
        if kind == "text_only":
            write_text(os.path.join(folder, "README.txt"), "no images here\n")
        return Run(ctx.train(ctx.path("out"), data=tree, epochs=1), mentions=["three"],
                   description=f"train/three (class '3' renamed) {'holds only README.txt' if kind else 'is empty'}",
                   facts={"class": "three"})
    return prepare


def _val_differs_prepare(kind):
    def prepare(ctx):
        tree = ctx.copy("digits")
        val = os.path.join(tree, "val")
        if kind == "extra":
            shutil.copytree(os.path.join(val, "7"), os.path.join(val, "seven_b"))
            named, what = "seven_b", "val has an extra class folder seven_b"
        else:
            os.rename(os.path.join(val, "5"), os.path.join(val, "five"))
            named, what = "five", "val/5 renamed to val/five (train keeps 5)"
        return Run(ctx.train(ctx.path("out"), data=tree, epochs=1), mentions=[named], description=what)
    return prepare


def _val_missing_prepare(ctx):
    tree = ctx.copy("digits")
    shutil.rmtree(os.path.join(tree, "val", "9"))
    weights = os.path.join(ctx.fx.get("run"), "latest")
    return Run(ctx.classification("tools/eval.py", f"model.weights={weights}", data=tree), mentions=["9"],
               description="eval a 10-class checkpoint on a val split without class folder 9")


def _val_missing_named(ctx, run, result):
    lines = [line for line in result.output.splitlines() if re.search(r"['\"/ ]9\b", line)
             and re.search(r"missing|absent|no images|not in", line, re.I)]
    if lines:
        return True, "exit 0 with a line naming the missing class 9"
    return False, "exit 0: accuracy reported over a val split missing class 9, nothing said"


def _all_unreadable_prepare(backend):
    def prepare(ctx):
        tree = ctx.copy("digits")
        for i, path in enumerate(sorted(glob.glob(os.path.join(tree, "train", "*", "*.jpg")))):
            garble(path, seed=i)
        return Run(ctx.train(ctx.path("out"), f"data.backend={backend}", data=tree, epochs=1), mentions=["train"],
                   description=f"every train image replaced by random bytes; data.backend={backend}")
    return prepare


def _missing_root(ctx):
    root = ctx.path("no_such_dataset")
    return Run(ctx.train(ctx.path("out"), data=root, epochs=1), mentions=["no_such_dataset"],
               description="data.root points to a directory that does not exist")


def _missing_val(ctx):
    tree = ctx.copy("digits")
    shutil.rmtree(os.path.join(tree, "val"))
    return Run(ctx.train(ctx.path("out"), data=tree, epochs=1), mentions=["val"],
               description="data.root has train/ but no val/")


def _check_data_zero_byte(ctx):
    tree = ctx.copy("digits")
    bad, _ = _zero_byte(ctx, tree)
    return Run(ctx.classification("tools/check_data.py", data=tree, args=("--out", ctx.path("report"))),
               description=f"check_data.py on a tree with zero-byte train/3/{os.path.basename(bad)}",
               facts={"bad": os.path.basename(bad)})


# ------------------------------------------------------------------------------------------ config

def _config_file(ctx, name, body):
    base = os.path.join(ctx.root, CLASSIFICATION_CONFIG)
    return write_text(ctx.path(name), f"_BASE_: [{base}]\n" + body)


def _train_with_config(ctx, path, *overrides):
    argv = ctx.train(ctx.path("out"), *overrides, epochs=1)
    argv[argv.index("-c") + 1] = path
    return argv


def _duplicate_keys(ctx):
    weights = os.path.join(ctx.fx.get("run"), "latest")
    path = _config_file(ctx, "dup.yaml", f"model:\n  weights: {weights}\ntrain:\n  epochs: 1\nmodel:\n"
                                         f"  num_classes: 10\n")
    return Run(_train_with_config(ctx, path), mentions=["dup.yaml", "model"],
               description="config file with two 'model:' sections (the first sets model.weights)")


def _file_unknown_key(ctx):
    path = _config_file(ctx, "bad.yaml", "train:\n  epoch: 3\n")
    return Run(_train_with_config(ctx, path), mentions=["bad.yaml", "train.epoch"],
               description="config file with train.epoch (unknown key)")


def _yaml_syntax(ctx):
    path = _config_file(ctx, "broken.yaml", "train:\n  epochs: [1, 2\n")
    return Run(_train_with_config(ctx, path), mentions=["broken.yaml"], description="config file with an "
               "unclosed '['")


def _missing_config(ctx):
    argv = ctx.train(ctx.path("out"), epochs=1)
    argv[argv.index("-c") + 1] = ctx.path("nope.yaml")
    return Run(argv, mentions=["nope.yaml"], description="-c names a file that does not exist")


def _override(description, mentions, *overrides):
    def prepare(ctx):
        return Run(ctx.train(ctx.path("out"), *overrides, epochs=1), mentions=list(mentions), description=description)
    return prepare


def _bad_o_syntax(ctx):
    argv = ctx.train(ctx.path("out"), epochs=1)
    argv.insert(argv.index("-o") + 1, "train.epochs")
    return Run(argv, mentions=["train.epochs"], description="-o train.epochs (no '=value')")


def cases():
    return [
        Case("zero_byte_jpeg_dali_error", DATA, "train.py", "", _zero_byte_prepare("dali", "error"),
             after=_named_not_neighbour),
        Case("zero_byte_jpeg_dali_skip", DATA, "train.py", "", _zero_byte_prepare("dali", None), expect="ok",
             check=_output_names("bad"), after=_named_not_neighbour),
        Case("zero_byte_jpeg_paddle", DATA, "train.py", "", _zero_byte_prepare("paddle", None), expect="ok",
             check=_output_names("bad"), after=_named_not_neighbour),
        Case("check_data_zero_byte_jpeg", DATA, "check_data.py", "", _check_data_zero_byte, expect="ok",
             check=_output_names("bad")),
        Case("empty_class_folder", DATA, "train.py", "", _class_folder_prepare(None),
             check=_output_names("class")),
        Case("class_folder_without_images", DATA, "train.py", "", _class_folder_prepare("text_only"),
             check=_output_names("class")),
        Case("val_missing_class", DATA, "eval.py", "", _val_missing_prepare, check=_val_missing_named),
        Case("val_extra_class", DATA, "train.py", "", _val_differs_prepare("extra")),
        Case("val_folder_renamed", DATA, "train.py", "", _val_differs_prepare("renamed")),
        Case("all_images_unreadable_dali", DATA, "train.py", "", _all_unreadable_prepare("dali")),
        Case("all_images_unreadable_paddle", DATA, "train.py", "", _all_unreadable_prepare("paddle")),
        Case("missing_data_root", DATA, "train.py", "", _missing_root, needs_fix=False),
        Case("missing_val_split", DATA, "train.py", "", _missing_val),
        Case("yaml_duplicate_keys", CONFIG, "train.py", "", _duplicate_keys),
        Case("yaml_unknown_key_in_file", CONFIG, "train.py", "", _file_unknown_key),
        Case("yaml_syntax_error", CONFIG, "train.py", "", _yaml_syntax),
        Case("config_file_missing", CONFIG, "train.py", "", _missing_config, needs_fix=False),
        Case("override_unknown_key", CONFIG, "train.py", "", _override("-o train.epoch=3 (unknown key)",
                                                                        ["train.epoch"], "train.epoch=3")),
        Case("override_wrong_type", CONFIG, "train.py", "", _override("-o train.epochs=abc", ["train.epochs", "abc"],
                                                                       "train.epochs=abc")),
        Case("override_bad_syntax", CONFIG, "train.py", "", _bad_o_syntax),
        Case("override_unparsable_value", CONFIG, "train.py", "", _override(
            "-o data.transforms.mean=[1,2 (unclosed list)", ["data.transforms.mean"], "data.transforms.mean=[1,2")),
        Case("unknown_dataset_value", CONFIG, "train.py", "", _override(
            "-o data.dataset=cocoo", ["data.dataset", "cocoo"], "data.dataset=cocoo")),
        Case("batch_size_zero", CONFIG, "train.py", "", _override("-o data.batch_size=0", ["data.batch_size"],
                                                                   "data.batch_size=0")),
    ]

