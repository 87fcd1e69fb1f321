"""BERT-Large, the paper's model and dropout, set up for NVIDIA GPUs (H100/H200).

Differs from configs/large.py only in how the same function is computed:
- bf16 compute, fp32 master weights and Adam state;
- fused attention with the paper's attention-probability dropout (0.1) drawn inside the kernel:
  bert_jax.kernels.gpu.fused_attention's Triton kernels for rows of 16-512 tokens, powers of two, packed or
  not (attention_impl='pallas'; with the query/key/value projection as one matmul feeding them,
  on an H100 1.34x the peer's seq/s at Large 128, 1.20x with cuDNN's, measured earlier; at Large
  512 83.7 against 89.1 ms a step with cuDNN's), cuDNN's (layers.cudnn_attention) for other rows
  (e.g. SQuAD's 384); cuDNN's dropout needs every layer to be its own call, so the layers are
  unrolled (scan_layers=False: longer compiles; measured about 1% slower than a scan unrolled
  24-fold on an H100 when rows of 128 went to cuDNN; kept since rows of 128 and 512 left cuDNN,
  not remeasured) and attention is not rematerialised;
- the tanh GELU of the original TF BERT code;
- each sublayer's bias + dropout + residual add + LayerNorm in one Triton kernel each way
  (layer_norm_impl='pallas', bert_jax/kernels/gpu/fused_norm.py; NVIDIA GPUs);
- the encoder's dense layers as 2-d matmuls (flat_matmuls): with the fused kernels' 16-bit
  dropout draws, 1.7-2.1% faster on an H100 (experiments/perf_notes.md);
- the feed-forward block in two Mosaic GPU kernels (ffn_impl='pallas', bert_jax/kernels/gpu/fused_ffn.py;
  Hopper GPUs only: on an A100 or older pass --config.model.ffn_impl=xla, which the run's check
  advises before compiling). On an H200 +1.4-2.4% a step at Base 128, +1.9% at Large 128 and
  +3.9% at Large 512 (444 against 427 seq/s); on an H100 at Large 512 387 against 386 seq/s
  without (experiments/perf_notes.md);
- the attention backward of rows over 128 tokens (phase 2's 512) in a Mosaic GPU kernel
  (long_attention_backward='mosaic', bert_jax/kernels/gpu/flash_backward.py; Hopper GPUs only, as ffn_impl):
  on an H100 the step at Large 32 x 512 79.8 -> 77.7 ms in one call (experiments/perf_notes.md);
- the attention backward of rows of 128 (phase 1) in another Mosaic GPU kernel, one block per row
  and head holding the whole row (short_attention_backward='mosaic', flash_backward.row_backward;
  Hopper GPUs only): on an H100 at Base 256 x 128 attention alone 0.432 -> 0.339 ms a layer
  forward+backward, the step 42.6 -> 41.2 ms (6,012 -> 6,212 seq/s, 52.8% -> 54.2% MFU), 43.07 ->
  42.48 ms on another H100; at Large 128 x 128 1,869 -> 1,888 seq/s (56.9% -> 57.7%). Its
  compile adds about 2.4 s a layer (Large 128's warm-up 147 -> 180 s);
- every matmul of the train step on cuBLAS (train.xla_options turns XLA's Triton gemms off), so
  that XLA folds bias adds and the GELU into cuBLASLt epilogues (with the tanh GELU's custom
  VJP, 1,622 -> 1,654 seq/s on an H100; experiments/perf_notes.md).
README, "GPU speed", compares it with transformers' BertForPreTraining under torch.compile.
"""

from configs import base, large


def get_config(arg=None):
  config = large.get_config()
  config.model.update(dtype='bfloat16', attention_impl='pallas', scan_layers=False, gelu='tanh',
                      layer_norm_impl='pallas', flat_matmuls=True, ffn_impl='pallas',
                      long_attention_backward='mosaic', short_attention_backward='mosaic')
  config.train.xla_options = 'xla_gpu_enable_triton_gemm=false'
  if arg:
    base.apply_arguments(config, arg)
  return config
