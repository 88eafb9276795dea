"""Do two runtimes' outputs for the same batch agree within the export check's tolerance?

``--backend auto`` compares every fp32 candidate with the reference (paddle-cpu fp32, the program the
export checked against the trained model): each of the two may be ``atol + rtol x max|output|`` from
the trained model (``tools/export_model.py --atol/--rtol``, 1e-4 each; ``inference.yml``
``export_check`` may record others), so they may differ by twice that.

Dense outputs (logits, probabilities) are compared value by value. Detections are compared as what
they are, per image a set of (box, score, class): a detector's scores can tie to the last bit (a
randomly initialised head scores thousands of anchors alike), and NMS then keeps tied boxes in either
order, so the same detections come out in another order. Each detection must meet one of the other
side's of the same class, with score and box within the tolerance; where an output is full
(``count`` = its size), detections scoring within the tolerance of its lowest score may be replaced by
tied ones left out, and are not required to meet.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

EXPORT_ATOL, EXPORT_RTOL = 1e-4, 1e-4
DETECTION_ROLES = ("boxes", "scores", "classes", "count")


def tolerance(meta: dict, values: Sequence[float]) -> float:
    check = meta.get("export_check") or {}
    atol, rtol = float(check.get("atol", EXPORT_ATOL)), float(check.get("rtol", EXPORT_RTOL))
    scale = float(np.max(np.abs(values))) if len(values) else 0.0
    return 2.0 * (atol + rtol * scale)


def _arrays(outputs: Sequence[dict]) -> List[np.ndarray]:
    """Worker ``output_values`` back to arrays (an output cut short keeps its whole leading rows)."""
    arrays = []
    for out in outputs:
        shape, values = out["shape"], np.asarray(out["values"], np.float64)
        row = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        rows = min(shape[0], values.size // max(row, 1)) if shape else 0
        arrays.append(values[:rows * row].reshape([rows] + list(shape[1:])))
    return arrays


def _image_detections_disagree(ref, other, box_tol: float, score_tol: float, capacity: int) -> Optional[str]:
    """``ref``/``other``: one image's ``(boxes [D, 4], scores [D], classes [D])``."""
    full = [d[1] for d in (ref, other) if len(d[1]) >= capacity]
    cut = min(float(np.min(s)) for s in full) + score_tol if full else -np.inf
    used = np.zeros(len(other[1]), bool)
    for j in np.argsort(-ref[1], kind="stable"):
        near = (~used & (other[2] == ref[2][j]) & (np.abs(other[1] - ref[1][j]) <= score_tol)
                & (np.max(np.abs(other[0] - ref[0][j]), axis=1) <= box_tol))
        if near.any():
            used[np.flatnonzero(near)[0]] = True
        elif ref[1][j] > cut:
            return f"detection (class {int(ref[2][j])}, score {ref[1][j]:.4g}) has no counterpart"
    unmatched = ~used & (other[1] > cut)
    if unmatched.any():
        k = int(np.flatnonzero(unmatched)[0])
        return f"extra detection (class {int(other[2][k])}, score {other[1][k]:.4g})"
    return None


def _detections_disagree(meta: dict, reference: Sequence[dict], outputs: Sequence[dict]) -> Optional[str]:
    ref, other = _arrays(reference), _arrays(outputs)
    box_tol, score_tol = tolerance(meta, reference[0]["values"]), tolerance(meta, reference[1]["values"])
    images = min(len(ref[3]), len(other[3]), len(ref[0]), len(other[0]))
    capacity = reference[0]["shape"][1]
    for i in range(images):
        n_ref, n_other = int(ref[3][i]), int(other[3][i])
        why = _image_detections_disagree((ref[0][i, :n_ref], ref[1][i, :n_ref], ref[2][i, :n_ref]),
                                         (other[0][i, :n_other], other[1][i, :n_other], other[2][i, :n_other]),
                                         box_tol, score_tol, capacity)
        if why:
            return f"image {i}: {why} (boxes within {box_tol:.3g}, scores within {score_tol:.3g})"
    return None


def disagreement(meta: dict, reference: Sequence[dict], outputs: Sequence[dict], reference_name: str) -> Optional[str]:
    """Why ``outputs`` (a worker's ``output_values``) do not pass for the reference's, or None."""
    if [o["shape"] for o in outputs] != [o["shape"] for o in reference]:
        return f"output shapes {[o['shape'] for o in outputs]} differ from {[o['shape'] for o in reference]}"
    if not all(np.isfinite(o["values"]).all() for o in outputs):
        return "outputs hold NaN or inf"
    if tuple(o.get("role") for o in meta["outputs"]) == DETECTION_ROLES:
        why = _detections_disagree(meta, reference, outputs)
        return f"detections differ from {reference_name}'s: {why}" if why else None
    for index, (ref, out) in enumerate(zip(reference, outputs)):
        a, b = np.asarray(out["values"], np.float64), np.asarray(ref["values"], np.float64)
        diff = float(np.max(np.abs(a - b))) if a.size else 0.0
        limit = tolerance(meta, ref["values"])
        if diff > limit:
            return f"output {index} differs from {reference_name}'s by {diff:.3g} > {limit:.3g}"
    return None
