"""How a replaced-token-detection generator and its discriminator share the embedding tables
(model.embedding_sharing), for any family whose embedding module has `tables()` and `embed()`.

  'shared'  ELECTRA's (Clark et al., 2020): one embedding module, read by both and trained by
            both losses.
  'gdes'    DeBERTa-v3's gradient-disentangled embedding sharing (He et al., 2021;
            microsoft/DeBERTa's rtd_task.py): the module's tables and LayerNorm are the
            generator's, trained by its MLM loss alone; the discriminator looks up
            stop_gradient(table) + `<table>_delta` (zeros at the start, so a run starts where
            'shared' does) and normalises with its own `discriminator_LayerNorm`. The
            discriminator's loss never pulls the generator's tables.

`gdes(Embeddings)` makes the 'gdes' module of a family's embedding class. Checkpoints keep the
deltas; discriminator_params materialises the discriminator's tables (table + delta) for export
and fine-tuning, generator_params-style callers drop them (is_discriminator_embedding).
"""

import jax
import flax.linen as nn
from flax import traverse_util

from bert_jax.models import layers

DELTA_SUFFIX = '_delta'
DISCRIMINATOR_LAYER_NORM = 'discriminator_LayerNorm'
EMBEDDINGS = 'bert/embeddings/'


def gdes(embeddings_cls):
  """The 'gdes' subclass of an embedding module class. The base class holds its tables as
  parameters named `*_embeddings`, returns them from `tables()` ({name: table}) and computes
  from given ones in `embed(tables, layer_norm, *inputs)`; its `__call__(*inputs)` is
  `embed(self.tables(), self.layer_norm, *inputs)`. Calling the subclass gives the
  discriminator's view; `generator_embed` and `generator_attend` the generator's."""

  class Gdes(embeddings_cls):  # pylint: disable=missing-class-docstring

    def setup(self):
      super().setup()
      cfg = self.config
      for name, table in super().tables().items():
        delta = self.param(name + DELTA_SUFFIX, nn.with_logical_partitioning(
            nn.initializers.zeros, ('vocab' if name == 'word_embeddings' else None, 'embed')),
                           table.shape, cfg.param_dtype)
        setattr(self, name + DELTA_SUFFIX, delta)
      self.discriminator_layer_norm = layers.layer_norm(
          cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype, name=DISCRIMINATOR_LAYER_NORM)

    def tables(self) -> dict:
      """The discriminator's tables: stop_gradient(the generator's) + its deltas."""
      return {name: jax.lax.stop_gradient(table) + getattr(self, name + DELTA_SUFFIX)
              for name, table in super().tables().items()}

    def __call__(self, *inputs, **kwargs):
      return self.embed(self.tables(), self.discriminator_layer_norm, *inputs, **kwargs)

    def attend(self, x):
      """Logits against the discriminator's word table: [..., embed] -> [..., vocab]."""
      return layers.tied_logits(x, self.tables()['word_embeddings'], self.config.dtype)

    def generator_embed(self, *inputs, **kwargs):
      return self.embed(super().tables(), self.layer_norm, *inputs, **kwargs)

    def generator_attend(self, x):
      return super().attend(x)

  Gdes.__name__ = Gdes.__qualname__ = 'Gdes' + embeddings_cls.__name__
  Gdes.__doc__ = (f'{embeddings_cls.__name__} under gradient-disentangled sharing (the '
                  'bert_jax.models.sharing docstring).')
  return Gdes


def is_discriminator_embedding(path: str) -> bool:
  """Whether `path` is one of 'gdes' mode's discriminator-only embedding parameters (a table's
  delta or the discriminator's LayerNorm), which neither exported model holds as such."""
  if not path.startswith(EMBEDDINGS):
    return False
  leaf = path[len(EMBEDDINGS):]
  return leaf.endswith(DELTA_SUFFIX) or leaf.startswith(DISCRIMINATOR_LAYER_NORM + '/')


def discriminator_params(flat: dict) -> dict:
  """{path: array} of a replaced-token-detection run -> the same with the discriminator's
  embeddings as it reads them: under 'gdes' each table is the generator's + its delta and
  `LayerNorm` the discriminator's own; the deltas and `discriminator_LayerNorm` are gone.
  Unchanged under 'shared' (no deltas). The generator's subtrees stay; callers keep what they
  need."""
  if not any(is_discriminator_embedding(k) for k in flat):
    return dict(flat)
  out = {k: v for k, v in flat.items() if not is_discriminator_embedding(k)}
  norm = EMBEDDINGS + DISCRIMINATOR_LAYER_NORM + '/'
  for path, value in flat.items():
    if path.endswith(DELTA_SUFFIX) and path.startswith(EMBEDDINGS):
      table = path[:-len(DELTA_SUFFIX)]
      out[table] = flat[table] + value
    elif path.startswith(norm):
      out[EMBEDDINGS + 'LayerNorm/' + path[len(norm):]] = value
  return out


def discriminator_tree(params: dict) -> dict:
  """discriminator_params on a nested parameter tree (a workdir's checkpoint); a tree without
  deltas comes back as it is."""
  flat = traverse_util.flatten_dict(params, sep='/')
  if not any(is_discriminator_embedding(k) for k in flat):
    return params
  return traverse_util.unflatten_dict(discriminator_params(flat), sep='/')
