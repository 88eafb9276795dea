"""Reading Paddle's pickles -- ``paddle.save`` files (``.pdparams``, ``.pdopt``) and ppdlx's ``.pdstates`` --
without running code planted in them.

``paddle.load`` unpickles with Python's unrestricted ``pickle.load``: a file may name any importable callable
(``os.system``) for it to call, and has no option to refuse. So the bytes go through
:class:`ppdlx.weights.unpickle.RestrictedUnpickler` (arrays, numbers, strings, containers; ``Refused``
names anything else before it is built), and then through the same steps ``paddle.load`` takes after its
``pickle.load`` (Paddle's own helpers: a split big parameter joined, the name table applied, arrays and
``(name, array)`` pairs made tensors), so a file reads back exactly as ``paddle.load`` would read it.
"""
from __future__ import annotations

import numpy as np
import paddle
from paddle.framework.io import _pack_loaded_dict, _parse_load_result

from ppdlx.weights.unpickle import restricted_loads

PADDLE_STRUCTURE_KEY = "StructuredToParameterName@@"  # paddle.save's name table, not a tensor


def load_paddle_pickle(data, return_numpy: bool = False):
    """What ``paddle.load(io.BytesIO(data), return_numpy=...)`` returns for a pickled object; ``Refused``
    (from ``ppdlx.weights.unpickle``) when the pickle would build anything but data."""
    value = restricted_loads(data, encoding="latin1")  # paddle.load's encoding
    if not isinstance(value, dict):
        return _parse_load_result(value, return_numpy)
    value = _pack_loaded_dict(value)
    names = value.pop(PADDLE_STRUCTURE_KEY, None)
    if names is None:
        return _parse_load_result(value, return_numpy)
    for key, name in names.items():
        if isinstance(value.get(key), np.ndarray) and not return_numpy:
            value[key] = paddle.to_tensor(value[key])
            value[key].name = name
    return value
