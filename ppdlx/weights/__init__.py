"""Import published checkpoints (PyTorch, safetensors, Paddle) into ppdlx models; see docs/weights.md."""
from ppdlx.weights.convert import convert_state, convert_weights, import_state, parse_weights_spec, summary_line
from ppdlx.weights.errors import WeightsError
from ppdlx.weights.readers import read_checkpoint
from ppdlx.weights.sources import SOURCES, detect_source

__all__ = ["SOURCES", "WeightsError", "convert_state", "convert_weights", "detect_source", "import_state",
           "parse_weights_spec", "read_checkpoint", "summary_line"]
