"""The class list a classification model was trained on, saved in each of its checkpoints and checked wherever the
checkpoint meets data again.

Labels are the indices of the sorted class folder names, so the same weights mean other classes on a split with
one folder more or less: every label after it shifts by one and the accuracy is wrong without any error. Training
saves the folder names in every checkpoint's ``.pdstates`` (under ``"classes"``, through the :class:`ClassList`
hook's state); resuming checks them against the training folders, evaluation against the val folders, and export
can take its labels from :func:`checked_class_names`. Checkpoints written before the list existed carry none:
evaluation then falls back to the training split's folders, else to ``model.num_classes``.
"""
from __future__ import annotations

import os
from typing import List, Optional

from ppdlx.checkpoint.files import locate, read_checkpoint
from ppdlx.data.image_folder import check_same_classes, class_folders
from ppdlx.errors import DataError

STATE_KEY = "classes"


class ClassList:
    """A trainer hook (``ppdlx.engine.hooks``) with no behaviour in the loop: its state is the training split's
    class folder names, which the trainer writes into every checkpoint's ``.pdstates``. Resuming with other
    training folders is refused."""

    name, state_key = "class_list", STATE_KEY
    trainer = None

    def __init__(self, names, split_dir: str):
        self.names, self.split_dir = [str(n) for n in names], split_dir

    def state_dict(self) -> dict:
        return {"names": list(self.names), "split_dir": self.split_dir}

    def set_state_dict(self, state) -> None:
        saved = names_in(state)
        if saved is not None:
            check_same_classes(self.split_dir, self.names, saved, "the class list of the checkpoint being resumed")


def names_in(state) -> Optional[List[str]]:
    names = state.get("names") if isinstance(state, dict) else None
    return [str(n) for n in names] if isinstance(names, (list, tuple)) else None


def saved_class_names(weights: Optional[str]) -> Optional[List[str]]:
    """The class list saved with the checkpoint ``weights`` names (None: not a ppdlx checkpoint, e.g. a foreign file
    ``model.weights`` imports, or one written before class lists were saved). A damaged state file is the
    checkpoint reader's one-line error."""
    if not weights or locate(weights)[0] is None:
        return None
    states = read_checkpoint(weights, ("states",))["states"]
    return names_in(states.get(STATE_KEY)) if states else None


def expected_classes(cfg, weights: Optional[str]):
    """``(class names, where they come from)`` that the val folders must match: the checkpoint's saved list, else
    (older checkpoints) the training split's folders; ``(None, "")`` when neither exists."""
    saved = saved_class_names(weights)
    if saved is not None:
        return saved, f"the class list saved with model.weights={weights}"
    train_dir = os.path.join(cfg.data.root, cfg.data.train_split)
    if os.path.isdir(train_dir):
        return class_folders(train_dir), "the training split's"
    return None, ""


def check_eval_classes(cfg, weights: Optional[str], found, split_dir: str) -> None:
    """``DataError`` when the class folders ``found`` in ``split_dir`` are not the ones ``weights`` was trained
    on (naming the missing and extra folders), or, with nothing to compare, not ``model.num_classes`` many."""
    expected, origin = expected_classes(cfg, weights)
    if expected is not None:
        check_same_classes(split_dir, found, expected, origin)
    elif len(found) != cfg.model.num_classes:
        raise DataError(f"{split_dir}: {len(found)} class folders but model.num_classes={cfg.model.num_classes}; "
                        f"labels are the indices of the sorted folder names, so they would not match the model's")


def checked_class_names(cfg, weights: Optional[str]) -> Optional[List[str]]:
    """The class list saved with ``weights``, checked against ``data.root``'s val class folders when that
    split exists (``DataError`` naming the folders that differ): what an export labels its outputs with.
    None when the checkpoint carries no list."""
    saved = saved_class_names(weights)
    split_dir = os.path.join(cfg.data.root, cfg.data.val_split)
    if saved is not None and os.path.isdir(split_dir):
        check_same_classes(split_dir, class_folders(split_dir), saved,
                           f"the class list saved with model.weights={weights}")
    return saved
