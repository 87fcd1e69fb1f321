"""The dispatch between XLA and the kernels: attention, the feed-forward block and the LayerNorm.

Model code calls these functions and never a kernel module. Each picks its implementation from a
static config value (model.attention_impl, ffn_impl, layer_norm_impl, the attention backwards)
and imports the kernel module it chose only when it is chosen, so a TPU or CPU run never loads
GPU kernel code. The config checks of those values live here too (ops.checks), beside the
kernels they guard.
"""

# The implementations each static config value may choose (config_lib checks them by these).
ATTENTION_IMPLS = ('xla', 'cudnn', 'pallas', 'tpu', 'splash')  # model.attention_impl
ATTENTION_BACKWARDS = ('triton', 'mosaic')  # model.long_ and short_attention_backward
FFN_IMPLS = ('xla', 'pallas')  # model.ffn_impl
NORM_IMPLS = ('xla', 'pallas')  # model.layer_norm_impl
