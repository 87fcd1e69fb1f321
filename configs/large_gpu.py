"""BERT-Large, the paper's model and dropout, set up for NVIDIA Hopper GPUs (H100/H200).

Differs from configs/large.py only in how the same function is computed (docs/gpu.md says what
each setting does, docs/performance.md what each measured):
- bf16 compute, fp32 master weights and Adam state;
- attention in the fused kernels with the paper's attention dropout drawn inside them
  (attention_impl='pallas'), both backwards on Mosaic GPU (long_ and short_attention_backward);
  the layers unrolled (scan_layers=False: cuDNN, which takes the rows the kernels do not, pairs
  each layer's dropout masks only when each layer is its own call);
- the tanh GELU of the original TF BERT code;
- each sublayer's bias + dropout + residual add + LayerNorm in one kernel each way
  (layer_norm_impl='pallas'), the dense layers as 2-d matmuls (flat_matmuls);
- the feed-forward block in two Mosaic GPU kernels (ffn_impl='pallas'; on an A100 or older pass
  --config.model.ffn_impl=xla and the attention backwards 'triton');
- every matmul on cuBLAS (train.xla_options turns XLA's Triton gemms off), so that XLA folds bias
  adds and the GELU into cuBLASLt epilogues.
"""

from configs import base, large

# How a Hopper GPU computes the encoder (config.model): the kernels above, the layers unrolled,
# the dense layers flat. configs/small.py's kernels='hopper' takes these too.
HOPPER_KERNELS = dict(attention_impl='pallas', scan_layers=False, layer_norm_impl='pallas',
                      flat_matmuls=True, ffn_impl='pallas', long_attention_backward='mosaic',
                      short_attention_backward='mosaic')
# Every matmul on cuBLAS, whose epilogues take the bias adds and the GELU (config.train).
HOPPER_XLA_OPTIONS = 'xla_gpu_enable_triton_gemm=false'


def get_config(arg=None):
  config = large.get_config()
  config.model.update(dtype='bfloat16', gelu='tanh', **HOPPER_KERNELS)
  config.train.xla_options = HOPPER_XLA_OPTIONS
  if arg:
    base.apply_pretraining_arguments(config, arg)
  return config
