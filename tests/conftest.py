import os
import sys

os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import pytest  # noqa: E402


def make_digits_tree(out_dir, per_class=None, size=32, classes=10, seed=0):
    """A small ImageFolder JPEG tree from scikit-learn's digits (real data, no download)."""
    import numpy as np
    from ppdlx.data.demo import load_digits_arrays, write_image_folder
    images, labels, names = load_digits_arrays()
    keep = labels < classes
    images, labels = images[keep], labels[keep]
    if per_class:
        idx = np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in range(classes)])
        images, labels = images[idx], labels[idx]
    write_image_folder(str(out_dir), images, labels, names[:classes], size, seed=seed)
    return str(out_dir)


@pytest.fixture(scope="session")
def tiny_tree(tmp_path_factory):
    """4 classes x 20 digits at 32 px: 64 train / 16 val images."""
    return make_digits_tree(tmp_path_factory.mktemp("tiny") / "digits", per_class=20, classes=4)


@pytest.fixture
def ppdlx_caplog(caplog):
    """caplog that also sees the ``ppdlx`` loggers (they do not propagate to the root logger)."""
    import logging
    logger = logging.getLogger("ppdlx")
    logger.addHandler(caplog.handler)
    yield caplog
    logger.removeHandler(caplog.handler)
