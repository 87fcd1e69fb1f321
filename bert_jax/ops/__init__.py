"""The dispatch between XLA and the kernels: attention, the feed-forward block and the LayerNorm.

Model code calls these functions and never a kernel module. Each picks its implementation from a
static config value (model.attention_impl, ffn_impl, layer_norm_impl, the attention backwards)
and imports the kernel module it chose only when it is chosen, so a TPU or CPU run never loads
GPU kernel code. The config checks of those values live here too (ops.checks), beside the
kernels they guard.
"""
