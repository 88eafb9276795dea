"""Task plug-ins (``ppdlx.registry.TASKS``): ``classification`` and ``detection``.

Everything that differs between the two lives here, behind :class:`ppdlx.tasks.base.Task`: the data and
model of a run, its objective and evaluator, its pre-processing (:mod:`.preprocess`), the class list its
checkpoints carry (:mod:`.class_list`), distillation (:mod:`.distill`), its per-class analysis and what
export needs. :func:`task_of` is the one place that maps a config to its task: the ``DATASETS`` entry named by
``data.dataset`` (an unknown name fails with "did you mean") and the task that trains on it;
:func:`task_of_model` maps a model to the task its ``default_cfg`` names.
"""
from __future__ import annotations

from ppdlx.tasks import classification, detection  # noqa: F401  (register the tasks)
from ppdlx.tasks.base import Task, TaskData, task_of, task_of_dataset, task_of_model  # noqa: F401
