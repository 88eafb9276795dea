"""int8 post-training quantization of exports, and the names of int8 that live below it.

* Post-training quantization of classification exports for Paddle Inference on CPU (oneDNN) and
  Paddle-TRT on GPU (one calibration, scales in the quantize ops): :func:`ppdlx.quantization.ptq.quantize`,
  ``tools/quantize.py``. It reads exports, so it stands above ``ppdlx.export`` and is imported by name
  (``ppdlx.quantization.ptq``), not here.
* Quantization-aware training is a choice made when a model is built (:mod:`ppdlx.models.qat`, ``qat.enabled``),
  trained by the one trainer in every graph mode; its int8 export is ``ppdlx.export.int8`` /
  ``ppdlx.export.onnx_qdq``, and the op types oneDNN runs in int8 are ``ppdlx.export.onednn_int8``'s. Their
  names are re-exported here.

docs/int8.md says why these routes.
"""
from ppdlx.export.onednn_int8 import ONEDNN_INT8_OPS  # noqa: F401
from ppdlx.models.qat import (NVIDIA_QUANTIZED_OPS, is_quantized, quantize_model,  # noqa: F401
                              refresh_weight_scales, running_ranges, without_quanters)
