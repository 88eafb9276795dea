"""Import published checkpoints (PyTorch, safetensors, Paddle) into ppdlx models, in memory; see docs/weights.md.

``ppdlx.checkpoint`` loads them as ``model.weights`` and writes converted files (``convert_weights``)."""
from ppdlx.weights.convert import convert_state, import_state, model_factory, parse_weights_spec, summary_line
from ppdlx.weights.errors import WeightsError
from ppdlx.weights.readers import read_checkpoint
from ppdlx.weights.sources import SOURCES, detect_source

__all__ = ["SOURCES", "WeightsError", "convert_state", "detect_source", "import_state", "model_factory",
           "parse_weights_spec", "read_checkpoint", "summary_line"]
