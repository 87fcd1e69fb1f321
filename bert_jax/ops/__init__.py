"""The dispatch between XLA and the kernels: attention, the feed-forward block and the LayerNorm.

Model code calls these functions and never a kernel module. Each picks its implementation from a
static config value (model.attention_impl, ffn_impl, layer_norm_impl, the attention backwards)
and imports the kernel module it chose only when it is chosen, so a TPU or CPU run never loads
GPU kernel code. The config checks of those values live here too (ops.checks), beside the
kernels they guard.

An attention kernel from outside the package is registered by name (`register_attention`) and
chosen as any other, with model.attention_impl=name (docs/ARCHITECTURE.md, "How to add a
kernel"). No jax here: config validation reads the names.
"""

import dataclasses
from typing import Any, Callable

from bert_jax.core import registry

# The implementations each static config value may choose (config_lib checks them by these).
ATTENTION_IMPLS = ('xla', 'cudnn', 'pallas', 'tpu', 'splash')  # model.attention_impl
ATTENTION_BACKWARDS = ('triton', 'mosaic')  # model.long_ and short_attention_backward
FFN_IMPLS = ('xla', 'pallas')  # model.ffn_impl
NORM_IMPLS = ('xla', 'pallas')  # model.layer_norm_impl
PLATFORMS = ('cpu', 'gpu', 'tpu')  # jax.default_backend()'s values.


@dataclasses.dataclass(frozen=True)
class AttentionKernel:
  """An attention implementation chosen by name, model.attention_impl=name."""
  name: str
  # attend(query, key, value, bias, *, rate, dropout_rng) -> [batch, length, heads, head_dim]:
  # query, key, value [batch, length, heads, head_dim] in the model's dtype; bias the additive
  # mask [batch, 1, 1 or length, length] (padding, packed pairs' blocks and the causal mask, 0 or
  # a large negative); rate the probabilities' dropout rate (0.0 when the step is deterministic);
  # dropout_rng a key of the 'dropout' stream when rate > 0, else None. It is traced over the
  # whole batch: XLA partitions jnp code over a mesh; a Pallas kernel runs per device under
  # ops.per_device.on_each_device, as ops/attention.py's kernels do.
  attend: Callable[..., Any]
  # The backends it runs on (PLATFORMS); config validation refuses a run on any other.
  platforms: tuple[str, ...] = PLATFORMS
  # Whether attend drops probabilities at `rate`; without, validation refuses
  # model.attention_dropout_rate > 0 (it would be rate 0 without saying so).
  dropout: bool = True

  def __post_init__(self):
    if self.name in ATTENTION_IMPLS:
      raise ValueError(f'An attention kernel cannot take the built-in name {self.name!r} '
                       f'(built in: {", ".join(ATTENTION_IMPLS)}).')
    unknown = sorted(set(self.platforms) - set(PLATFORMS))
    if unknown or not self.platforms:
      raise ValueError(f'AttentionKernel {self.name!r}: platforms {self.platforms!r}; each is one '
                       f'of {PLATFORMS}, at least one.')


ATTENTION_KERNELS = registry.Registry('attention kernel', __name__, ())
register_attention = ATTENTION_KERNELS.register


def attention_impls() -> tuple[str, ...]:
  """Every model.attention_impl: the built-in ones, then the registered kernels'."""
  return ATTENTION_IMPLS + tuple(ATTENTION_KERNELS.available())


def registered_attention(impl: str) -> AttentionKernel | None:
  """The registered kernel model.attention_impl=impl chooses; None for a built-in one."""
  return None if impl in ATTENTION_IMPLS else ATTENTION_KERNELS.get(impl)
