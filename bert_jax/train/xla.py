"""XLA and compilation-cache setup a run needs before JAX compiles: the flags that must be in
XLA_FLAGS before JAX starts its backends, and the persistent compilation cache's directory."""

import os

from bert_jax.core.errors import ConfigError
from bert_jax.ops import checks


# XLA records cuDNN kernels into CUDA graphs ("command buffers") by default; a cuDNN attention
# with dropout inside one aborts the process (XLA passes no device ordinal for the dropout
# offset). These are XLA's default command-buffer kinds less CUDNN.
COMMAND_BUFFER_WITHOUT_CUDNN = (
    '--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,DYNAMIC_SLICE_FUSION')


def apply_compilation_cache(config) -> str:
  """Points JAX's persistent compilation cache at config.train.compilation_cache_dir and returns
  that directory ('' when the key is empty: JAX's own setting stands). A local directory is
  created and must be writable, or ConfigError names it; gs:// and other URLs go to JAX as given.
  """
  value = (config.get('train') or {}).get('compilation_cache_dir', '')
  if not isinstance(value, str):
    raise ConfigError(f'config.train.compilation_cache_dir={value!r} must be a directory (a '
                      "string), or '' for no cache.")
  if not value:
    return ''
  directory = value
  if '://' not in value:
    directory = os.path.abspath(os.path.expanduser(value))
    from bert_jax.core import checkpoint  # pylint: disable=g-import-not-at-top
    try:
      os.makedirs(directory, exist_ok=True)
      checkpoint.write_probe(directory)
    except OSError as e:
      raise ConfigError(f'config.train.compilation_cache_dir={value!r} is not a writable '
                        f"directory ({e.strerror or e}); name one that is, or '' for no "
                        'cache.') from e
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update('jax_compilation_cache_dir', directory)
  return directory


def needs_cudnn_outside_command_buffers(config) -> bool:
  from bert_jax.data import checks as data_checks  # pylint: disable=g-import-not-at-top
  model = config.get('model') or {}
  return (model.get('attention_dropout_rate', 0) > 0
          and checks.cudnn_attention_possible(model, data_checks.row_lengths(config)))


def apply_xla_flags(config) -> None:
  """Sets the XLA flags a config needs in XLA_FLAGS, before JAX starts its backends.

  Called by the entry points first thing. A user's own --xla_gpu_enable_command_buffer is kept.
  When the backends already run (a notebook that used JAX first) on a GPU without the flag, the
  config is refused: the run would abort in its first step.
  """
  if not needs_cudnn_outside_command_buffers(config):
    return
  current = os.environ.get('XLA_FLAGS', '')
  if '--xla_gpu_enable_command_buffer' in current:
    return
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  if not xla_bridge.backends_are_initialized():
    os.environ['XLA_FLAGS'] = f'{current} {COMMAND_BUFFER_WITHOUT_CUDNN}'.strip()
    return
  import jax  # pylint: disable=g-import-not-at-top
  if jax.default_backend() == 'gpu':
    raise ConfigError(
        f"config.model.attention_impl='{config.model.attention_impl}' with attention dropout "
        f'needs XLA_FLAGS="{COMMAND_BUFFER_WITHOUT_CUDNN}" set before JAX starts (JAX is already '
        'running here); restart with it, or set config.model.attention_dropout_rate=0.0.')
