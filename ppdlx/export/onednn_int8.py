"""Paddle Inference's oneDNN int8 on CPU, for every int8 export (PTQ and QAT alike): the op types it is placed
on and the activation headroom a CPU without VNNI needs (docs/int8.md)."""
from ppdlx.cpu_features import cpu_features, has_vnni

# oneDNN int8 is placed on these op types only: with pool2d too, Paddle 3.3.1's cpu_quantize_pass gives
# a pool fed by a projection-shortcut block an s8 input and a u8 output, which oneDNN refuses to create.
ONEDNN_INT8_OPS = ("conv2d", "fused_conv2d", "fc")
# Without VNNI, oneDNN multiplies u8 activations by s8 weights with vpmaddubsw, which adds two
# products into a SATURATING 16-bit sum: 255 * 127 * 2 overflows it and the conv output is clipped.
# Widening every activation range by this factor keeps u8 activations <= 128, whose pair sums fit
# (docs/int8.md). It costs one bit of activation resolution wherever the export runs, TensorRT
# included, hence recorded in inference.yml.
ACTIVATION_HEADROOM = 2.0


def default_headroom() -> tuple:
    """``(factor, reason)`` for this CPU: 2 without VNNI (see ACTIVATION_HEADROOM), else 1."""
    if has_vnni(cpu_features()):
        return 1.0, "this CPU has VNNI: int8 dot products accumulate in 32 bits"
    return ACTIVATION_HEADROOM, ("this CPU has no VNNI: oneDNN's u8 x s8 kernels (vpmaddubsw) saturate 16-bit "
                                 "pair sums, so activations keep 7 bits of headroom")
