"""Evaluation: metrics of a model over a (rank-sharded) val split, merged over ranks.

* :mod:`.classification` -- ``ClassificationEvaluator``: top-1/top-5 and the loss, optionally every image's logits
  for the per-class analysis;
* :mod:`.coco` -- ``CocoEvaluator``: pycocotools box AP over the detections of a post-processed detector,
  ``detections_to_coco``, ``coco_evaluate``;
* :mod:`.precise_bn` -- ``recompute_bn_stats``: BatchNorm statistics re-estimated for the weights evaluated.

An evaluator is ``evaluator(model) -> metrics`` with a ``primary`` metric (the one that picks "best"); the task
plug-ins (``ppdlx.tasks``) build them.
"""
from ppdlx.evaluation.classification import ClassificationEvaluator  # noqa: F401
from ppdlx.evaluation.coco import (STAT_KEYS, CocoEvaluator, coco_evaluate, coco_evaluation,  # noqa: F401
                                   detections_to_coco)
from ppdlx.evaluation.precise_bn import recompute_bn_stats  # noqa: F401
