"""int8 post-training quantization of classification exports for Paddle Inference on CPU (oneDNN)
and Paddle-TRT on GPU (one calibration, scales in the quantize ops): :func:`quantize`.
``tools/quantize.py`` exports a config's model and calibrates it; docs/int8.md says why this route.
"""
from ppdlx.quantization.compare import ONEDNN_INT8_OPS, Int8Runner, compare_predictions  # noqa: F401
from ppdlx.quantization.images import ExportPreprocess, labelled_images, list_images, spread_subset  # noqa: F401
from ppdlx.quantization.ptq import (ACTIVATION_HEADROOM, ALGOS, DEFAULT_ALGO, DEFAULT_BATCH_SIZE,  # noqa: F401
                                    DEFAULT_MIN_AGREEMENT, DEFAULT_NUM_IMAGES, QUANT_OPS, RUNTIME_CALLS,
                                    CalibrationCheckError, check_output_dir, default_headroom, quantize)
