"""int8 quantization.

* Quantization-aware training (:mod:`ppdlx.quantization.qat`): a built model with fake quantization where
  NVIDIA's QAT has it, trained by the one trainer in every graph mode (``qat.enabled``); its int8 export is
  ``ppdlx.export.int8`` / ``ppdlx.export.onnx_qdq``.
* Post-training quantization of classification exports for Paddle Inference on CPU (oneDNN) and
  Paddle-TRT on GPU (one calibration, scales in the quantize ops): :func:`ppdlx.quantization.ptq.quantize`,
  ``tools/quantize.py``. It reads exports, so it is imported by name (``ppdlx.quantization.ptq``), not here.

docs/int8.md says why these routes.
"""
from ppdlx.quantization.onednn import ONEDNN_INT8_OPS  # noqa: F401
from ppdlx.quantization.qat import (NVIDIA_QUANTIZED_OPS, is_quantized, quantize_model,  # noqa: F401
                                    refresh_weight_scales, running_ranges, without_quanters)
