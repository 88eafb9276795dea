"""A published checkpoint converted once into a ppdlx checkpoint file pair: ``<prefix>.pdparams`` (the weights
under ppdlx's names) and ``<prefix>.pdstates`` (``weights_import``: where they came from), written atomically and
checked by loading them back the way ``model.weights`` loads them (``tools/convert_weights.py``)."""
from __future__ import annotations

from typing import Callable, Optional, Union

import paddle

from ppdlx.checkpoint.files import atomic_save, load_prefix_weights, strip_suffix
from ppdlx.weights import WeightsError, convert_state, model_factory


def convert_weights(source: str, path: str, model: Union[str, Callable], output_prefix: str,
                    num_classes: Optional[int] = None, state_key: Optional[str] = None, prefer_ema: bool = True,
                    model_args: Optional[dict] = None) -> dict:
    """Convert and write ``<output_prefix>.pdparams`` / ``.pdstates``; returns the metadata."""
    state, metadata = convert_state(source, path, model, num_classes, state_key, prefer_ema, model_args)
    prefix = strip_suffix(output_prefix)
    metadata["output"] = prefix
    atomic_save({k: paddle.to_tensor(v) for k, v in state.items()}, prefix + ".pdparams")
    atomic_save({"weights_import": metadata}, prefix + ".pdstates", plain_pickle=True)
    # the same loader as model.weights, into the model at the final class count
    missing = load_prefix_weights(model_factory(model, model_args)(metadata["num_classes"]), prefix)
    if sorted(missing) != sorted(metadata["reinitialised"]):
        raise WeightsError(f"{prefix}.pdparams: written, but loading it leaves {missing[:3]} unset")
    return metadata
