"""The pretraining model: an encoder from the models registry with its objectives' heads, and
the shape-only batches its init and lowering trace.

Parameters: the encoder under its family's scope (`bert/`), each head under its own name
(`predictions/`, `seq_relationship/`), as the original BERT's checkpoints lay them out. An
objective with a `corrupt` step (ELECTRA's generator) runs it before the encoder, which then
reads the batch it returns; its modules sit beside the heads (`generator/`, ...).
"""

from typing import Any

import flax.linen as nn
import jax

from bert_jax import models
from bert_jax import objectives as objectives_lib


class PretrainingModel(nn.Module):
  """Encoder + heads: batch -> {output name: array} (e.g. 'mlm_logits', 'nsp_logits')."""
  config: Any  # The encoder's frozen config (its family's config_from).
  # Names in the objectives registry, or Objectives configured by the run: ObjectiveSet.items.
  objectives: tuple = ('mlm', 'nsp')
  model: str = 'bert'  # Name in the models registry.

  @nn.compact
  def __call__(self, batch, deterministic: bool = True):
    # batch: the keys of objectives.batch_spec; input_ids, segment_ids, input_mask [batch,
    # length]; packed rows also position_ids, pair_ids [batch, length] and nsp_positions
    # [batch, pairs] (each pair's [CLS], pooled); cross-lingual rows language_ids [batch, length].
    family = models.get(self.model)
    encoder = family.encoder(self.config, name=family.scope)
    outputs = {}
    for name in self.objectives:
      corrupt = objectives_lib.objective_of(name).corrupt
      if corrupt is not None:  # E.g. ELECTRA's generator: the encoder reads its samples.
        batch, produced = corrupt(self.config, encoder, batch, deterministic)
        outputs.update(produced)
    inputs = {key: batch[key] for key in family.inputs if key in batch}
    sequence, pooled = encoder(batch['input_ids'], batch['segment_ids'], batch['input_mask'],
                               deterministic, batch.get('position_ids'), batch.get('pair_ids'),
                               batch.get('nsp_positions'), **inputs)
    encoded = objectives_lib.Encoded(sequence, pooled, encoder.attend)
    for name in self.objectives:
      outputs.update(objectives_lib.objective_of(name).head(self.config, encoded, batch,
                                                            deterministic))
    return outputs


def build(config) -> PretrainingModel:
  """The pretraining model a run's config describes (config.model.name, config.objectives)."""
  return build_from(config, objectives_lib.resolve(config))


def build_from(config, run_objectives: objectives_lib.ObjectiveSet) -> PretrainingModel:
  """build, with the config's objectives already resolved (objectives.resolve(config))."""
  name = config.model.get('name', 'bert')
  return PretrainingModel(models.get(name).config_from(config), run_objectives.items, name)


def objectives_of(model: PretrainingModel):
  """The model's Objectives (names resolved through the registry)."""
  return tuple(objectives_lib.objective_of(item) for item in model.objectives)


def dummy_batch(batch_size: int, max_seq_length: int, max_predictions: int,
                max_pairs_per_row: int = 0, objectives=('mlm', 'nsp'), languages: bool = False):
  """Shape-only batch (as jax.ShapeDtypeStruct) for init, lowering and compilation.

  max_pairs_per_row > 0: a packed batch (the packing keys, NSP labels per pair); languages:
  cross-lingual rows (position and language ids).
  """
  shape = objectives_lib.BatchShape(max_seq_length, max_predictions, max_pairs_per_row,
                                    languages)
  spec = objectives_lib.batch_spec([objectives_lib.objective_of(n) for n in objectives], shape)
  return {k: jax.ShapeDtypeStruct((batch_size,) + s, dtype) for k, (s, dtype) in spec.items()}
