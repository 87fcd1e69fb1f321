"""config.train.xla_options ('name=value,...'): XLA debug options for the train step's compile,
parsed into jit's compiler_options and checked (the form without JAX, XLA's acceptance with it)."""

import re

from bert_jax.core.errors import ConfigError


def parse(config) -> dict:
  """config.train.xla_options ('name=value,...') as jit's compiler_options; checks the form.

  Whether XLA knows each name and value is checked by `check_with_xla`, once JAX runs.
  """
  text = config.train.get('xla_options', '')
  if not isinstance(text, str):
    raise ConfigError(f'config.train.xla_options={text!r} must be a string of name=value items, '
                      "e.g. 'xla_gpu_enable_triton_gemm=false'.")
  options = {}
  # A comma starts a new item only before an option name: values may hold commas themselves
  # (xla_gpu_enable_command_buffer=FUSION,CUBLAS).
  for item in filter(None, (part.strip() for part in re.split(r',(?=\s*-*xla_)', text))):
    name, sep, value = item.partition('=')
    name, value = name.strip().lstrip('-'), value.strip()
    if not sep or not re.fullmatch(r'xla_[a-z0-9_]+', name):
      raise ConfigError(
          f'config.train.xla_options={text!r}: {item!r} is not name=value with an XLA debug '
          "option's name (xla_...), e.g. 'xla_gpu_enable_triton_gemm=false'.")
    if name in options:
      raise ConfigError(f'config.train.xla_options={text!r} sets {name} twice.')
    options[name] = _option_value(value)
  return options


def _option_value(text: str):
  """'false' -> False, '2' -> 2, else the text: XLA takes typed values for typed options."""
  if text.lower() in ('true', 'false'):
    return text.lower() == 'true'
  try:
    return int(text)
  except ValueError:
    return text


def check_with_xla(config) -> None:
  """Compiles a one-op function with config.train.xla_options, so that a name or value XLA does
  not know fails here, naming the key, rather than in the train step's compile."""
  options = parse(config)
  if not options:
    return
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  try:
    jax.jit(lambda x: x + 1, compiler_options=options).lower(jnp.zeros(())).compile()
  except Exception as e:  # XLA's error names the option: pylint: disable=broad-except
    raise ConfigError(f'config.train.xla_options={config.train.xla_options!r}: XLA refused it: '
                      f'{str(e).splitlines()[0]}') from e
