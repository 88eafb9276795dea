"""n:m mask computation and checking (NVIDIA convention: keep ``n`` of every ``m``).

Every weight is viewed as a 2-D matrix whose *rows* are output positions and whose
*columns* are input channels, so groups of ``m`` are consecutive columns -- the
pattern TensorRT's / cuSPARSELt's sparse kernels need:

* conv ``[Cout, Cin, kh, kw]`` (Paddle's layout for both NCHW and NHWC) ->
  ``[kw, kh, Cout, Cin]`` -> ``(kw*kh*Cout, Cin)``: groups of ``m`` along Cin for
  each ``(cout, kh, kw)``.
* linear ``[in, out]`` (Paddle's ``Linear.weight``) -> transposed ``(out, in)``:
  groups of ``m`` along the input dimension (axis 0 of the weight).

This is the same view ``paddle.incubate.asp`` builds (``create_mask(w.T).T``), so
masks match Paddle's own for 2:4; ours are vectorised (Paddle's loop over groups in
Python takes minutes on ResNet50), and ``mask_1d`` keeps exactly ``n`` per group, also
on ties and all-zero groups.
"""
from __future__ import annotations

import numpy as np

KINDS = ("conv2d", "linear")
ALGOS = ("mask_1d", "mask_2d_greedy")


def _check_nm(n: int, m: int) -> None:
    if not (isinstance(n, (int, np.integer)) and isinstance(m, (int, np.integer)) and 0 < n < m):
        raise ValueError(f"need 0 < n < m for an n:m pattern, got n={n}, m={m}")


def weight_to_matrix(weight: np.ndarray, kind: str) -> np.ndarray:
    """The 2-D view (rows, in_channels) of a Paddle weight; groups run along the last axis."""
    w = np.asarray(weight)
    if kind == "conv2d":
        if w.ndim != 4:
            raise ValueError(f"conv2d weight must be 4-D [Cout, Cin, kh, kw], got shape {list(w.shape)}")
        return w.transpose(3, 2, 0, 1).reshape(-1, w.shape[1])
    if kind == "linear":
        if w.ndim != 2:
            raise ValueError(f"linear weight must be 2-D [in, out], got shape {list(w.shape)}")
        return w.T
    raise ValueError(f"unknown weight kind {kind!r} (known: {', '.join(KINDS)})")


def matrix_to_weight(mat: np.ndarray, kind: str, shape) -> np.ndarray:
    """Inverse of :func:`weight_to_matrix`."""
    shape = tuple(int(s) for s in shape)
    if kind == "conv2d":
        cout, cin, kh, kw = shape
        return np.ascontiguousarray(mat.reshape(kw, kh, cout, cin).transpose(2, 3, 1, 0))
    if kind == "linear":
        return np.ascontiguousarray(mat.T)
    raise ValueError(f"unknown weight kind {kind!r} (known: {', '.join(KINDS)})")


def mask_1d(mat: np.ndarray, n: int = 2, m: int = 4) -> np.ndarray:
    """Keep the ``n`` largest-magnitude entries of every ``m`` consecutive entries of a row.

    ``mat.shape[1]`` must be a multiple of ``m``. Returns a bool matrix with exactly
    ``n`` True per group (ties: the earlier entry wins).
    """
    _check_nm(n, m)
    mat = np.asarray(mat)
    rows, cols = mat.shape
    if cols % m:
        raise ValueError(f"mask_1d: {cols} columns is not a multiple of m={m}")
    groups = np.abs(mat.astype(np.float32)).reshape(rows, cols // m, m)
    order = np.argsort(-groups, axis=-1, kind="stable")
    mask = np.zeros(groups.shape, dtype=bool)
    np.put_along_axis(mask, order[..., :n], True, axis=-1)
    return mask.reshape(rows, cols)


def mask_2d_greedy(mat: np.ndarray, n: int = 2, m: int = 4) -> np.ndarray:
    """2-D greedy n:m: in every ``m x m`` block keep entries in descending magnitude while
    their row and their column hold fewer than ``n`` kept entries.

    Result: every row of every block keeps *at most* ``n`` (so the 1-D pattern along the
    input channels holds) and every column of a block keeps at most ``n`` (so the
    transposed matrix, used by the backward pass, is n:m too). Greedy can leave a row
    with fewer than ``n`` (density slightly below n/m, ~0.49 for 2:4 on random weights);
    ``mask_1d`` always keeps exactly ``n``. Identical to Paddle's ``get_mask_2d_greedy``
    (same block order, rows zero-padded to a multiple of ``m``) apart from tie order;
    columns must be a multiple of ``m``.
    """
    _check_nm(n, m)
    mat = np.asarray(mat)
    rows, cols = mat.shape
    if cols % m:
        raise ValueError(f"mask_2d_greedy: {cols} columns is not a multiple of m={m}")
    prow = -(-rows // m) * m
    padded = np.zeros((prow, cols), dtype=np.float32)
    padded[:rows] = np.abs(mat.astype(np.float32))
    br, bc = prow // m, cols // m
    blocks = padded.reshape(br, m, bc, m).transpose(0, 2, 1, 3).reshape(br * bc, m * m)
    order = np.argsort(-blocks, axis=-1, kind="stable")
    nb = blocks.shape[0]
    at = np.arange(nb)
    keep = np.zeros((nb, m * m), dtype=bool)
    row_count = np.zeros((nb, m), dtype=np.int32)
    col_count = np.zeros((nb, m), dtype=np.int32)
    for i in range(m * m):  # m*m vectorised passes over all blocks at once
        idx = order[:, i]
        r, c = idx // m, idx % m
        ok = (row_count[at, r] < n) & (col_count[at, c] < n)
        keep[at, idx] = ok
        row_count[at, r] += ok
        col_count[at, c] += ok
    mask = keep.reshape(br, bc, m, m).transpose(0, 2, 1, 3).reshape(prow, cols)
    return mask[:rows]


_ALGO_FNS = {"mask_1d": mask_1d, "mask_2d_greedy": mask_2d_greedy}


def compute_mask(weight, kind: str, n: int = 2, m: int = 4, algo: str = "mask_1d") -> np.ndarray:
    """Bool mask (same shape as ``weight``) keeping ``n`` of every ``m`` input channels."""
    if algo not in _ALGO_FNS:
        raise ValueError(f"unknown mask algorithm {algo!r} (known: {', '.join(ALGOS)})")
    w = np.asarray(weight)
    mat = weight_to_matrix(w, kind)
    return matrix_to_weight(_ALGO_FNS[algo](mat, n, m), kind, w.shape)


def group_nonzeros(weight, kind: str, m: int = 4) -> np.ndarray:
    """Non-zero count of every group of ``m`` input channels: shape (rows, in_channels/m)."""
    mat = weight_to_matrix(np.asarray(weight), kind)
    rows, cols = mat.shape
    if cols % m:
        raise ValueError(f"{cols} input channels is not a multiple of m={m}")
    return np.count_nonzero(mat.reshape(rows, cols // m, m), axis=-1)


def nm_violations(weight, kind: str, n: int = 2, m: int = 4):
    """``(violating_groups, total_groups)``: groups with more than ``n`` non-zeros of ``m``."""
    counts = group_nonzeros(weight, kind, m)
    return int((counts > n).sum()), int(counts.size)


def is_nm_sparse(weight, kind: str, n: int = 2, m: int = 4) -> bool:
    return nm_violations(weight, kind, n, m)[0] == 0


def block_counts_2d(mask, kind: str, m: int = 4):
    """Per ``m x m`` block of the 2-D view (rows zero-padded): kept entries per row and
    per column, shapes ``(blocks, m)`` each. Used to check the 2-D greedy contract."""
    mat = weight_to_matrix(np.asarray(mask), kind) != 0
    rows, cols = mat.shape
    prow = -(-rows // m) * m
    padded = np.zeros((prow, cols), dtype=bool)
    padded[:rows] = mat
    blocks = padded.reshape(prow // m, m, cols // m, m).transpose(0, 2, 1, 3).reshape(-1, m, m)
    return blocks.sum(axis=2), blocks.sum(axis=1)


def density(weight) -> float:
    w = np.asarray(weight)
    return float(np.count_nonzero(w)) / max(w.size, 1)


def pack_mask(mask: np.ndarray) -> dict:
    """Compact, picklable form of a bool mask (1 bit per weight) for checkpoints."""
    mask = np.asarray(mask, dtype=bool)
    return {"shape": list(mask.shape), "bits": np.packbits(mask.reshape(-1))}


def unpack_mask(packed: dict) -> np.ndarray:
    shape = tuple(int(s) for s in packed["shape"])
    size = int(np.prod(shape)) if shape else 1
    return np.unpackbits(np.asarray(packed["bits"], dtype=np.uint8), count=size).astype(bool).reshape(shape)
