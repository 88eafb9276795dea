"""fp32 export vs its int8 calibration on real images, both through Paddle Inference on CPU
(oneDNN): per-image top-1 agreement, top-1 accuracy of each when labels are known, and the
largest output difference."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ppdlx.errors import UnsupportedError
from ppdlx.export import ModelFiles, PaddleInferenceRunner
from ppdlx.quantization.images import ExportPreprocess
from ppdlx.export.onednn_int8 import ONEDNN_INT8_OPS


class Int8Runner(PaddleInferenceRunner):
    """:class:`~ppdlx.export.PaddleInferenceRunner` with oneDNN int8 on: the quantize ops' scales
    become int8 oneDNN kernels (``quant_dequant_onednn_pass`` + ``cpu_quantize_pass``). A legacy
    ``.pdmodel`` is required: Paddle's PIR CPU passes only delete quantize ops (docs/int8.md)."""

    def __init__(self, files: ModelFiles, threads: int = 1):
        super().__init__(files, threads=threads, int8_ops=ONEDNN_INT8_OPS)


def compare_predictions(fp32_files: ModelFiles, int8_files: ModelFiles, preprocess: ExportPreprocess,
                        paths: Sequence[str], labels: Optional[np.ndarray] = None, batch_size: int = 8,
                        threads: int = 1) -> dict:
    """Run both exports over ``paths``; ``labels`` (class ids) adds top-1 accuracies."""
    fp32, int8 = PaddleInferenceRunner(fp32_files, threads=threads), Int8Runner(int8_files, threads=threads)
    fp32_top, int8_top, max_diff = [], [], 0.0
    for feeds in preprocess.batches(paths, batch_size):
        a = fp32.run(feeds)[0]
        try:
            b = int8.run(feeds)[0]
        except RuntimeError as err:  # oneDNN refusing a primitive surfaces here, not at predictor creation
            raise UnsupportedError(f"{int8_files.model_dir}: Paddle Inference's oneDNN int8 cannot run this model "
                                   f"on this CPU: {str(err).strip().splitlines()[-1]}") from None
        fp32_top.append(a.argmax(-1))
        int8_top.append(b.argmax(-1))
        max_diff = max(max_diff, float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()))
    fp32_top, int8_top = np.concatenate(fp32_top), np.concatenate(int8_top)
    result = {"images": int(len(paths)), "top1_agreement": float((fp32_top == int8_top).mean()),
              "max_abs_output_diff": max_diff}
    if labels is not None:
        result["fp32_top1"] = float((fp32_top == labels).mean())
        result["int8_top1"] = float((int8_top == labels).mean())
        result["top1_drop_points"] = 100.0 * (result["fp32_top1"] - result["int8_top1"])
    return result
