"""Old import path of the shared blocks, which now live in ``ppdlx.layers``.

Only ``tests/data/test_dali_coco.py`` and ``tests/ops/test_onednn.py`` still import from here;
once they import ``ppdlx.layers.ConvNormAct`` this module can go.
"""
from ppdlx.layers import ConvNormAct as ConvBNAct  # noqa: F401
