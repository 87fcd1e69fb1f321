"""Checks of the kernel settings in config.model, before anything compiles: each error names the
key, its value and what would work instead."""

import jax

from bert_jax import ops
from bert_jax.core.errors import ConfigError
from bert_jax.ops import attention
from bert_jax.ops import ffn


def cudnn_attention_possible(model, lengths) -> bool:
  """Whether some rows may go through cuDNN's attention: attention_impl='cudnn', or 'pallas' with
  a row length (or head size) that fused_attention's kernels do not take."""
  if model.get('attention_impl') != 'pallas':
    return model.get('attention_impl') == 'cudnn'
  if model.hidden_size % model.num_heads:
    return True  # _check_model refuses it.
  head_dim = model.hidden_size // model.num_heads
  return not all(attention.kernel_rows(n, head_dim) for n in lengths)


def check_model(model, lengths) -> None:
  """The kernel settings of config.model fit together for rows of these lengths (no devices
  needed)."""
  if (model.get('causal', False) and model.attention_impl not in ('xla', 'tpu')
      and ops.registered_attention(model.attention_impl) is None):
    # cuDNN gets key lengths and the GPU fused kernels segment ids: neither takes the causal
    # bias; the TPU kernels apply the causal mask themselves, a registered kernel gets it in its
    # bias.
    raise ConfigError(
        f"config.model.causal=True needs config.model.attention_impl='xla' (got "
        f"{model.attention_impl!r}), or 'tpu' on TPUs: the causal mask is an attention bias, "
        "which the GPU kernels do not take. Set attention_impl='xla'.")
  kernel = ops.registered_attention(model.attention_impl)
  if kernel is not None and not kernel.dropout and model.attention_dropout_rate > 0:
    raise ConfigError(
        f'config.model.attention_impl={kernel.name!r} is a registered kernel without dropout; '
        f'got config.model.attention_dropout_rate={model.attention_dropout_rate}. Set it to 0.0 '
        "(a departure from the paper's 0.1), or attention_impl='xla'.")
  # 'pallas' runs the rows fused_attention does not take through cuDNN; its own kernels draw
  # their dropout from the rng stream, so scans and remat keep their masks.
  if cudnn_attention_possible(model, lengths) and model.attention_dropout_rate > 0:
    # cuDNN drops attention probabilities in the kernel; its backward finds the forward's mask
    # only when each layer is its own call, run once per step (see attention.cudnn_attention).
    impl = model.attention_impl
    if model.scan_layers:
      raise ConfigError(
          f"config.model.attention_impl='{impl}' with attention dropout "
          f'(config.model.attention_dropout_rate={model.attention_dropout_rate}) needs '
          'config.model.scan_layers=False: under a scan every layer would share one mask '
          'stream and the backward would read the layers\' masks in reverse order. Set '
          'scan_layers=False, or attention_dropout_rate=0.0 (a documented departure from the '
          "paper), or attention_impl='xla'.")
    if model.remat_policy != 'none':
      raise ConfigError(
          f"config.model.attention_impl='{impl}' with attention dropout needs "
          f"config.model.remat_policy='none' (got {model.remat_policy!r}): a recomputed "
          'attention would draw a new mask. Use remat_policy=\'none\', attention_dropout_rate=0.0 '
          "or attention_impl='xla'.")
  if model.get('ffn_impl', 'xla') == 'pallas' and model.gelu != 'tanh':
    raise ConfigError(
        f"config.model.ffn_impl='pallas' computes the tanh GELU (its kernel's gradient); got "
        f"config.model.gelu={model.gelu!r}. Set gelu='tanh' (the original BERT code's), or "
        "ffn_impl='xla'.")
  if model.attention_impl == 'pallas' and not model.hidden_size % model.num_heads:
    _check_mosaic_attention(model, lengths)


def _check_mosaic_attention(model, lengths) -> None:
  """long_attention_backward and short_attention_backward on Mosaic GPU ('mosaic';
  bert_jax/kernels/gpu/flash_backward.py) take 16-bit compute, heads of 64 or 128 (wgmma) and rows of 64
  tokens or more (a wgmma's 64 rows); checked only when the run has rows that the kernel would
  take."""
  head_dim = model.hidden_size // model.num_heads
  kernel_rows = [n for n in lengths if attention.kernel_rows(n, head_dim)]
  for key, rows in (
      ('long_attention_backward', [n for n in kernel_rows if n > attention.long_row_threshold()]),
      ('short_attention_backward', [n for n in kernel_rows if n <= attention.long_row_threshold()])):
    value = model.get(key, 'triton')
    if value != 'mosaic' or not rows:
      continue
    if model.dtype == 'float32' or head_dim not in (64, 128):
      raise ConfigError(
          f"config.model.{key}='{value}' takes 16-bit compute and heads of 64 or 128 (wgmma); "
          f'got config.model.dtype={model.dtype!r}, head size {head_dim} (hidden_size '
          f"{model.hidden_size} / num_heads {model.num_heads}). Use {key}='triton'.")
    if any(n % 64 for n in rows):
      raise ConfigError(
          f"config.model.{key}='{value}' takes rows of 64 tokens or more (a wgmma's 64 rows); "
          f"this run has rows of {sorted(set(rows))}. Use {key}='triton'.")


# TPU generations whose Mosaic compiler refuses the TPU attention kernels' 16-bit matmuls
# ("Unsupported matmul RHS type on target: vector<128x128xbf16>", libtpu 0.0.42.1); with
# float32 compute they compile.
TPU_KINDS_WITHOUT_ATTENTION_KERNELS = ('TPU v2', 'TPU v3')


def check_tpu_kernels(config, device_kind: str) -> None:
  """attention_impl='tpu' with 16-bit compute on a TPU generation that cannot compile its
  kernels for it: a ConfigError naming the generation, before anything compiles."""
  if (config.model.get('attention_impl') == 'tpu' and config.model.get('dtype') != 'float32'
      and device_kind in TPU_KINDS_WITHOUT_ATTENTION_KERNELS):
    raise ConfigError(
        f"config.model.attention_impl='tpu': Mosaic does not compile the TPU attention kernels "
        f"for {device_kind} devices with model.dtype={config.model.dtype!r} (their 16-bit "
        "matmuls); use attention_impl='xla' there (configs/tpu.py does for v3), "
        "model.dtype='float32', or a TPU v4 or later.")


def check_gpu_kernels(config) -> None:
  """A registered attention kernel runs on the backends it names (AttentionKernel.platforms).
  model.layer_norm_impl and attention_impl 'pallas' run Triton kernels: NVIDIA GPUs only;
  ffn_impl 'pallas' and the attention kernels set to 'mosaic' Mosaic GPU kernels: Hopper
  GPUs only (any number: on a mesh each GPU runs them on its rows of the batch under
  shard_map)."""
  backend, count = jax.default_backend(), jax.device_count()
  kernel = ops.registered_attention(config.model.get('attention_impl', 'xla'))
  if kernel is not None and backend not in kernel.platforms:
    raise ConfigError(
        f'config.model.attention_impl={kernel.name!r} is a registered kernel that runs on '
        f"{' and '.join(kernel.platforms)} devices; this run has {count} {backend} device(s). "
        f"Use attention_impl='xla' (any device), or run on {' or '.join(kernel.platforms)}.")
  if backend == 'tpu':
    check_tpu_kernels(config, jax.devices()[0].device_kind)
  if backend == 'gpu' and config.model.get('attention_impl') in ('tpu', 'splash'):
    # Off TPUs the TPU kernels run in Pallas's interpreter: right, for tests, but far too slow
    # to train with. CPUs are let through for the tests and for AOT compiles for TPUs.
    raise ConfigError(
        f"config.model.attention_impl={config.model.attention_impl!r} runs Pallas TPU (Mosaic) "
        f"kernels; this run has {count} gpu device(s). Use attention_impl 'pallas', 'cudnn' or "
        "'xla'.")
  if backend != 'gpu':
    for key, kernels in (('layer_norm_impl', 'Triton kernels on NVIDIA GPUs'),
                         ('attention_impl', 'Triton kernels on NVIDIA GPUs'),
                         ('ffn_impl', 'a Mosaic GPU kernel on NVIDIA Hopper GPUs')):
      if config.model.get(key, 'xla') == 'pallas':
        raise ConfigError(
            f"config.model.{key}='pallas' runs {kernels}; this run has {count} {backend} "
            f"device(s). Use {key}='xla' (any device, any mesh).")
    return
  mosaic = (('ffn_impl', ('pallas',), "ffn_impl='xla'"),
            ('long_attention_backward', ('mosaic',), "long_attention_backward='triton'"),
            ('short_attention_backward', ('mosaic',), "short_attention_backward='triton'"))
  for key, values, instead in mosaic:
    value = config.model.get(key, None)
    if value in values and not ffn.on_hopper():
      device = jax.devices()[0]
      raise ConfigError(
          f"config.model.{key}='{value}' runs a Mosaic GPU kernel (wgmma, TMA) on NVIDIA Hopper "
          f"GPUs (compute capability 9.x); this run has {device.device_kind} (compute "
          f"capability {getattr(device, 'compute_capability', '?')}). Use {instead}.")
