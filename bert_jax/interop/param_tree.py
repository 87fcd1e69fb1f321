"""Parameter trees as flat {'a/b/c': leaf} maps, and BERT's encoder layers between their two
layouts: unscanned (bert/encoder/layer_N/..., one subtree per layer) and scanned
(bert/encoder/layer/..., each leaf stacked [L, ...]). The interop modules map checkpoints leaf
by leaf in the flat form; a run's tree is in either layout (config.model.scan_layers)."""

import re

from flax import traverse_util
import numpy as np

# An unscanned layer's leaf: group 1 the layer's index, group 2 the path inside it.
LAYER = re.compile(r'^bert/encoder/layer_(\d+)/(.*)$')


def flatten(tree) -> dict:
  """Nested dicts -> {'a/b/c': leaf}."""
  return traverse_util.flatten_dict(tree, sep='/')


def unflatten(flat: dict):
  """{'a/b/c': leaf} -> nested dicts."""
  return traverse_util.unflatten_dict(flat, sep='/')


# ModernBERT's first layer has no attention norm (its attention reads the embeddings' norm); a
# scanned stack gives every layer one and never reads the first's. Stacking fills that one with
# the identity (shaped as the layer's mlp_norm), unstacking drops it.
_UNREAD_FIRST, _ITS_SHAPE = 'attn_norm/', 'mlp_norm/'


def stack_layers(flat: dict, num_layers: int) -> dict:
  """Unscanned bert/encoder/layer_N/... leaves -> scanned bert/encoder/layer/... [L, ...]."""
  out = {k: v for k, v in flat.items() if not LAYER.match(k)}
  rests = {LAYER.match(k).group(2) for k in flat if LAYER.match(k)}
  rests |= {_UNREAD_FIRST + rest[len(_ITS_SHAPE):] for rest in rests if rest.startswith(_ITS_SHAPE)}
  for rest in sorted(rests):
    leaves = [flat.get(f'bert/encoder/layer_{n}/{rest}') for n in range(num_layers)]
    if leaves[0] is None and rest.startswith(_UNREAD_FIRST):
      like = flat[f'bert/encoder/layer_0/{_ITS_SHAPE}{rest[len(_UNREAD_FIRST):]}']
      leaves = [(np.ones_like(like) if rest.endswith('scale') else np.zeros_like(like))
                if leaf is None else leaf for leaf in leaves]
    out[f'bert/encoder/layer/{rest}'] = np.stack(leaves)
  return out


def unstack_layers(flat: dict) -> dict:
  """Scanned bert/encoder/layer/... [L, ...] -> unscanned bert/encoder/layer_N/... leaves."""
  out = {}
  for path, value in flat.items():
    if path.startswith('bert/encoder/layer/'):
      for n, layer in enumerate(value):
        if n == 0 and path.startswith(f'bert/encoder/layer/{_UNREAD_FIRST}'):
          continue
        out[path.replace('/layer/', f'/layer_{n}/', 1)] = layer
    else:
      out[path] = value
  return out
