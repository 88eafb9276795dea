"""Where Paddle Inference's oneDNN int8 is placed (CPU), for every int8 export (PTQ and QAT alike)."""

# oneDNN int8 is placed on these op types only: with pool2d too, Paddle 3.3.1's cpu_quantize_pass gives
# a pool fed by a projection-shortcut block an s8 input and a u8 output, which oneDNN refuses to create.
ONEDNN_INT8_OPS = ("conv2d", "fused_conv2d", "fc")
