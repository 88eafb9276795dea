"""n:m masks: exact counts along the right axis, agreement with paddle.incubate.asp."""
import numpy as np
import paddle
import pytest

from ppdlx.sparsity.masks import (block_counts_2d, compute_mask, mask_1d, mask_2d_greedy, matrix_to_weight,
                                  nm_violations, pack_mask, unpack_mask, weight_to_matrix)

RNG = np.random.default_rng(0)


def conv_groups(mask, m=4):
    """Kept count of every group of m input channels, indexed [cout, group, kh, kw] (written out by hand)."""
    cout, cin, kh, kw = mask.shape
    return mask.reshape(cout, cin // m, m, kh, kw).sum(axis=2)


def linear_groups(mask, m=4):
    """Linear weight is [in, out]: groups of m along axis 0 for every output -> [group, out]."""
    i, o = mask.shape
    return mask.reshape(i // m, m, o).sum(axis=1)


@pytest.mark.parametrize("n,m", [(2, 4), (1, 4), (3, 8)])
def test_mask_1d_conv_keeps_n_largest_of_every_m_input_channels(n, m):
    w = RNG.standard_normal((6, 16, 3, 3)).astype(np.float32)
    mask = compute_mask(w, "conv2d", n, m, "mask_1d")
    assert mask.shape == w.shape and mask.dtype == bool
    assert (conv_groups(mask, m) == n).all()
    # the kept entries are the largest magnitudes of their group (checked at one position by hand)
    group = np.abs(w[2, m:2 * m, 1, 0])
    kept = np.flatnonzero(mask[2, m:2 * m, 1, 0])
    assert sorted(kept.tolist()) == sorted(np.argsort(-group)[:n].tolist())


@pytest.mark.parametrize("n,m", [(2, 4), (1, 4)])
def test_mask_1d_linear_groups_along_the_input_axis(n, m):
    w = RNG.standard_normal((16, 5)).astype(np.float32)  # Paddle Linear: [in, out]
    mask = compute_mask(w, "linear", n, m, "mask_1d")
    assert (linear_groups(mask, m) == n).all()
    # not along the output axis: a [16, 8] weight grouped along axis 1 would generally differ
    col = np.abs(w[4:8, 3])
    assert sorted(np.flatnonzero(mask[4:8, 3]).tolist()) == sorted(np.argsort(-col)[:n].tolist())


def test_paddle_conv_weight_is_cout_cin_kh_kw_for_both_layouts():
    for fmt in ("NCHW", "NHWC"):
        assert list(paddle.nn.Conv2D(8, 16, (3, 5), data_format=fmt).weight.shape) == [16, 8, 3, 5]
    assert list(paddle.nn.Linear(8, 16).weight.shape) == [8, 16]


def test_ties_and_all_zero_groups_still_keep_exactly_n():
    w = np.zeros((4, 8, 1, 1), np.float32)
    w[0, :4] = 1.0  # four equal magnitudes
    mask = compute_mask(w, "conv2d", 2, 4, "mask_1d")
    assert (conv_groups(mask) == 2).all()


def test_masks_match_paddle_incubate_asp_for_2_4():
    import paddle.incubate.asp as pasp
    for shape, kind in [((8, 16, 3, 3), "conv2d"), ((6, 8, 1, 1), "conv2d"), ((32, 12), "linear")]:
        w = RNG.standard_normal(shape).astype(np.float32)
        for algo, palgo in [("mask_1d", pasp.MaskAlgo.MASK_1D), ("mask_2d_greedy", pasp.MaskAlgo.MASK_2D_GREEDY)]:
            ref = pasp.create_mask(w.T, func_name=palgo, n=2, m=4).T.astype(bool)
            assert np.array_equal(compute_mask(w, kind, 2, 4, algo), ref), (shape, algo)
            assert pasp.check_sparsity((w * ref).T, n=2, m=4)


@pytest.mark.parametrize("shape,kind", [((12, 16, 3, 3), "conv2d"), ((5, 8, 3, 3), "conv2d"), ((24, 10), "linear")])
def test_mask_2d_greedy_row_and_column_constraints(shape, kind):
    w = RNG.standard_normal(shape).astype(np.float32)
    mask = compute_mask(w, kind, 2, 4, "mask_2d_greedy")
    rows, cols = block_counts_2d(mask, kind, 4)
    assert rows.max() <= 2 and cols.max() <= 2  # at most n per row and per column of every 4x4 block
    assert nm_violations(mask.astype(np.float32), kind, 2, 4)[0] == 0  # so the 1-D TensorRT pattern holds
    assert 0.45 < mask.mean() <= 0.5  # greedy may leave a row short of n
    # the transposed block view is n:m too: rows of W^T blocks are the columns of W blocks
    mat = weight_to_matrix(mask, kind)
    assert np.array_equal(matrix_to_weight(mat, kind, mask.shape), mask)


def test_mask_2d_greedy_keeps_the_largest_entry_of_each_block():
    mat = RNG.standard_normal((8, 8)).astype(np.float32)
    mask = mask_2d_greedy(mat, 2, 4)
    for r in (0, 4):
        for c in (0, 4):
            block = np.abs(mat[r:r + 4, c:c + 4])
            i = np.unravel_index(np.argmax(block), block.shape)
            assert mask[r + i[0], c + i[1]]


def test_violations_count_groups_with_too_many_nonzeros():
    w = RNG.standard_normal((4, 8, 1, 1)).astype(np.float32)
    w *= compute_mask(w, "conv2d")
    assert nm_violations(w, "conv2d") == (0, 8)
    w[1, 0:4, 0, 0] = 1.0
    assert nm_violations(w, "conv2d") == (1, 8)
    with pytest.raises(ValueError):
        mask_1d(np.ones((2, 6)), 2, 4)


def test_pack_roundtrip():
    mask = RNG.random((7, 12, 3, 3)) > 0.5
    assert np.array_equal(unpack_mask(pack_mask(mask)), mask)
