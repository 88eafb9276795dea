"""Task plug-ins (``ppdlx.registry.TASKS``): ``classification`` and ``detection``.

:func:`task_of` is the one place that maps a config to its task: the ``DATASETS`` entry named
by ``data.dataset`` (an unknown name fails with "did you mean") and the task that trains on it.
The contract is :class:`ppdlx.engine.tasks.base.Task`.
"""
from __future__ import annotations

from ppdlx.engine.tasks import classification, detection  # noqa: F401  (register the tasks)
from ppdlx.engine.tasks.base import Task, TaskData  # noqa: F401
from ppdlx.registry import DATASETS, TASKS


def task_of(cfg) -> Task:
    import ppdlx.data.coco  # noqa: F401  (registers the "coco" dataset)
    import ppdlx.data.image_folder  # noqa: F401  (registers "image_folder")
    name = cfg.data.dataset
    DATASETS.get(name)
    for task_name in TASKS.names():
        task = TASKS.get(task_name)
        if name in task.datasets:
            return task
    raise KeyError(f"no task trains on data.dataset={name}")
