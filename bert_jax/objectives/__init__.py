"""Pretraining objectives, by name: what each training signal adds to an encoder.

An objective is one module in this package (or anywhere, registered with `register`) holding an
Objective: the batch keys it reads, the head it puts on the encoder's outputs (its parameters
under the head's own name), its loss as pooled sums and counts, the metrics.jsonl fields made of
them, and its FLOPs per sequence for MFU. config.objectives names the run's objectives ('mlm,nsp':
BERT; 'mlm': no NSP, as RoBERTa; 'mlm,sop': ALBERT; 'clm': a left-to-right LM); the pretraining
model, the train step, the metrics and the benchmark compose whatever it names, so a new
objective is a new file plus a config.
"""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from bert_jax.core import registry
from bert_jax.core.errors import ConfigError

# The objectives shipped in this package (each registers itself on import).
BUILTIN = ('clm', 'mlm', 'nsp', 'sop', 'distill', 'rtd', 'sbo')

# Config keys that no longer exist whose role config.objectives took, and what replaced them.
RENAMED = {'data.nsp': "now config.objectives: 'mlm,nsp' for NSP, 'mlm' without"}

# Per-example trailing shapes and dtypes of batch keys: {'masked_lm_ids': ((P,), int32), ...}.
BatchSpec = Mapping[str, tuple[tuple[int, ...], Any]]


@dataclasses.dataclass(frozen=True)
class Encoded:
  """What an encoder hands the heads."""
  sequence: jax.Array  # [batch, length, embed]: the last layer's states.
  pooled: jax.Array  # [batch, embed] (packed rows: [batch, pairs, embed]): the pooler on [CLS].
  attend: Callable[[jax.Array], jax.Array]  # [..., embed] -> [..., vocab]: tied embeddings.


@dataclasses.dataclass(frozen=True)
class BatchShape:
  """The static shape of a pretraining batch's rows (one phase of a run)."""
  max_seq_length: int
  max_predictions: int
  max_pairs_per_row: int = 0  # > 0: packed rows, that many instances each at most.
  # Cross-lingual rows (data.languages): each token's position and language ids.
  languages: bool = False


@dataclasses.dataclass(frozen=True)
class Objective:
  """One pretraining objective. Every function is pure; `head` builds linen modules and is
  called inside the pretraining model's compact __call__, so its modules are the model's
  children (their names are parameter paths: keep them when a checkpoint layout must hold)."""
  name: str
  # BatchShape -> the batch keys it reads beyond the encoder's inputs.
  batch_spec: Callable[[BatchShape], BatchSpec]
  # (model config, Encoded, batch, deterministic) -> {output name: array}.
  head: Callable[[Any, Encoded, Mapping, bool], dict]
  # (outputs, batch) -> {'<name>_...': sums and counts}, pooled exactly over batches and devices.
  losses: Callable[[Mapping, Mapping], dict]
  # Pooled stats (arrays or floats) -> its term of the training loss.
  loss: Callable[[Mapping], Any]
  # Pooled stats (floats) -> its metrics.jsonl fields, '<name>_loss' among them (the run's
  # 'loss' is their sum), e.g. mlm_loss, mlm_accuracy.
  metrics: Callable[[Mapping], dict]
  # (model config dict (config.model), BatchShape) -> training FLOPs per sequence / 3 (forward).
  flops: Callable[[Any, BatchShape], float]
  # Batch -> the counts among its `losses` stats (what `loss` divides by), from the batch alone,
  # e.g. {'mlm_weight': ...}. A gradient-accumulating step divides each micro-batch's loss by the
  # whole batch's counts, so the micro-batches' gradients add up to the whole batch's. None: the
  # objective cannot train with train.grad_accum_steps > 1.
  counts: Callable[[Mapping], dict] | None = None
  # The data it needs: 'pairs' ([CLS] A [SEP] B [SEP] with NotNext labels) or 'segments'
  # (one segment per row).
  instances: str = 'segments'
  # With instances='pairs', which pairs its label tells apart (next_sentence_labels): 'next'
  # (NSP: B is the text after A, 0, or a random document's, 1) or 'order' (SOP: A and B are
  # consecutive in one document, in order, 0, or swapped, 1).
  pair_kind: str = 'next'
  # Whether it needs corrupted inputs (MLM's [MASK]s): a run none of whose objectives does reads
  # its rows unmasked (data.pretraining.MaskingSettings.from_config).
  masks_inputs: bool = False
  # The attention it trains: True needs config.model.causal=True (each token sees itself and
  # earlier ones), False bidirectional attention; config validation checks the run's agree.
  causal: bool = False
  # The run's ConfigDict -> this objective with its settings bound (distill: the teacher's shape,
  # the loss weights, the temperature); None: it has no settings beyond the batch's shape.
  configure: Callable[[Any], 'Objective'] | None = None
  # Top-level parameter scopes it adds that training never changes (distill: 'teacher'): the
  # optimizer gives them no update and keeps no state for them (train/optim.py), and an export
  # leaves them out.
  frozen: tuple[str, ...] = ()
  # (model config, encoder, batch, deterministic) -> (the batch the encoder reads, {output name:
  # array}): run by the pretraining model before the encoder, e.g. ELECTRA's generator replacing
  # the masked tokens (its modules are the model's children, as a head's). None: the encoder
  # reads the batch as it is.
  corrupt: Callable[[Any, Any, Mapping, bool], tuple[Mapping, dict]] | None = None
  # (the run's ConfigDict, the run's objective names) -> None; raises ConfigError naming the key,
  # the value and what is valid when its settings do not fit the run. `check` (below) calls it
  # for every registered objective, named or not: one not named refuses a setting only it reads
  # (rtd: model.embedding_sharing). None: it has nothing to check.
  check: Callable[[Any, tuple[str, ...]], None] | None = None
  # Its own config keys' valid values, checked in every pretraining config by config_lib:
  # {'distill.temperature': core.schema.Range, ...} and {'distill.teacher_model.gelu': (...)}.
  ranges: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  choices: Mapping[str, tuple] = dataclasses.field(default_factory=dict)


REGISTRY = registry.Registry('objective', __name__, BUILTIN)
register = REGISTRY.register
get = REGISTRY.get
available = REGISTRY.available


def parse(text: str) -> tuple[str, ...]:
  """'mlm,nsp' -> ('mlm', 'nsp'): config.objectives' form; ValueError for an unknown name, a
  repeat, or none at all."""
  names = tuple(n.strip() for n in str(text).split(',') if n.strip())
  if not names:
    raise ValueError(f'config.objectives={text!r} names no objective; valid objectives are '
                     f'{", ".join(available())} (comma separated, e.g. \'mlm,nsp\').')
  for name in names:
    if name not in available():
      raise ValueError(f'config.objectives={text!r}: unknown objective {name!r}; valid '
                       f'objectives are {", ".join(available())}.')
  if len(set(names)) != len(names):
    raise ValueError(f'config.objectives={text!r} names an objective twice.')
  pairs = [name for name in names if get(name).instances == 'pairs']
  if len(pairs) > 1:
    # Each labels the pair in next_sentence_labels, with its own meaning (NotNext, swapped).
    raise ValueError(f'config.objectives={text!r} names {" and ".join(pairs)}, each a label of '
                     'the same sentence pair; a run trains one of them.')
  return names


def ranges() -> dict:
  """{key: Range} of every registered objective's own keys (Objective.ranges)."""
  return REGISTRY.merged('ranges')


def choices() -> dict:
  """{key: valid values} of every registered objective's own keys (Objective.choices)."""
  return REGISTRY.merged('choices')


def check(config) -> None:
  """The run's objectives fit together and the config: one attention, the model's; counts for a
  gradient-accumulating run; then every registered objective's own check (Objective.check).
  config.objectives' names are checked first (parse)."""
  try:
    names = parse(config.objectives)
  except ValueError as e:
    raise ConfigError(str(e)) from e
  _check_counts(config, names)
  _check_attention(config, names)
  for name in available():
    objective = get(name)
    if objective.check is not None:
      objective.check(config, names)


def _check_counts(config, names) -> None:
  """A micro-batch's loss divides by the whole batch's counts (Objective.counts), which every
  objective of a gradient-accumulating run must give."""
  steps = config.train.grad_accum_steps
  unsupported = [n for n in names if get(n).counts is None]
  if steps > 1 and unsupported:
    raise ConfigError(
        f'config.train.grad_accum_steps={steps}: objective(s) {", ".join(unsupported)} give no '
        'counts (Objective.counts), which a micro-batch\'s loss divides by; train them with '
        'grad_accum_steps=1.')


def _check_attention(config, names) -> None:
  """The objectives agree on the attention they train, and it is config.model.causal's."""
  causal = [n for n in names if get(n).causal]
  bidirectional = [n for n in names if n not in causal]
  if causal and bidirectional:
    raise ConfigError(
        f'config.objectives={config.objectives!r} mixes objectives of causal attention '
        f'({", ".join(causal)}) and of bidirectional attention ({", ".join(bidirectional)}); a '
        "run trains one encoder with one attention: e.g. config.objectives='clm' with "
        "config.model.causal=True, or 'mlm,nsp' with causal=False.")
  wanted = bool(causal)
  if bool(config.model.get('causal', False)) != wanted:
    if wanted:
      raise ConfigError(
          f'config.objectives={config.objectives!r} needs causal attention ({", ".join(causal)}: '
          'each token predicts the next from itself and earlier ones): set '
          f'config.model.causal=True (got {config.model.get("causal", False)}).')
    raise ConfigError(
        f'config.objectives={config.objectives!r} needs bidirectional attention, but '
        'config.model.causal=True; a masked LM with causal attention is not BERT. Set '
        "config.model.causal=False, or config.objectives='clm' for a left-to-right LM.")
  if wanted and config.data.get('packing'):
    raise ConfigError('config.data.packing=True with config.model.causal=True is not supported '
                      '(attention within each packed pair is not made causal); set '
                      'config.data.packing=False.')


@dataclasses.dataclass(frozen=True)
class ObjectiveSet:
  """A run's objectives, resolved once from its config (resolve): what the data, the model and
  the train step read of them."""
  names: tuple[str, ...]  # config.objectives' names, in its order.
  # What the pretraining model holds: each objective's name, or the Objective itself configured
  # by the run where it has settings (Objective.configure).
  items: tuple
  objectives: tuple[Objective, ...]  # The Objectives, configured, in the names' order.

  @property
  def sentence_pairs(self) -> bool:
    """Whether the rows are sentence pairs with NotNext labels (an objective needs them)."""
    return any(o.instances == 'pairs' for o in self.objectives)

  @property
  def pair_kind(self) -> str:
    """How the sentence pairs are made (Objective.pair_kind): 'next' or 'order'; '' when the
    rows are not pairs."""
    kinds = [o.pair_kind for o in self.objectives if o.instances == 'pairs']
    return kinds[0] if kinds else ''

  @property
  def masks_inputs(self) -> bool:
    """Whether the rows are masked (an objective predicts corrupted tokens)."""
    return any(o.masks_inputs for o in self.objectives)

  @property
  def frozen_scopes(self) -> tuple[str, ...]:
    """The top-level parameter scopes the objectives freeze (Objective.frozen)."""
    return tuple(scope for o in self.objectives for scope in o.frozen)


def resolve(config) -> ObjectiveSet:
  """The objectives config.objectives names, in its order, each configured by the run's config
  where it has settings (Objective.configure); ValueError as parse."""
  items = []
  for name in parse(config.objectives):
    objective = get(name)
    items.append(name if objective.configure is None else objective.configure(config))
  items = tuple(items)
  return ObjectiveSet(tuple(objective_of(item).name for item in items), items,
                      tuple(objective_of(item) for item in items))


def objective_of(item) -> Objective:
  """An objective's name or a (configured) Objective -> the Objective."""
  return item if isinstance(item, Objective) else get(item)


def batch_spec(objectives, shape: BatchShape) -> dict[str, tuple[tuple[int, ...], Any]]:
  """The whole batch's per-example spec: the encoder's inputs, the packing keys for packed rows,
  the position and language ids of cross-lingual ones, and every objective's keys."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  s = shape.max_seq_length
  spec = {'input_ids': ((s,), jnp.int32), 'input_mask': ((s,), jnp.int32),
          'segment_ids': ((s,), jnp.int32)}
  if shape.max_pairs_per_row:
    spec.update({'position_ids': ((s,), jnp.int32), 'pair_ids': ((s,), jnp.int32)})
  if shape.languages:
    spec.update({'position_ids': ((s,), jnp.int32), 'language_ids': ((s,), jnp.int32)})
  for objective in objectives:
    spec.update(objective.batch_spec(shape))
  return spec


def losses(objectives, outputs, batch) -> dict:
  """Every objective's sums and counts on one batch."""
  stats = {}
  for objective in objectives:
    stats.update(objective.losses(outputs, batch))
  return stats


def counts(objectives, batch) -> dict:
  """Every objective's counts on one batch (Objective.counts): what the training loss divides
  by."""
  out = {}
  for objective in objectives:
    out.update(objective.counts(batch))
  return out


def total_loss(objectives, stats):
  """The training loss: the sum of the objectives' terms, in their order."""
  total = None
  for objective in objectives:
    term = objective.loss(stats)
    total = term if total is None else total + term
  return total


def summarize(objectives, stats) -> dict[str, float]:
  """Pooled sums and counts -> the metrics.jsonl fields: each objective's (among them
  '<name>_loss'), and 'loss', the sum of those. A stat is a scalar or, as a histogram, a
  vector (read as a float64 array)."""
  stats = {k: float(v) if np.ndim(v) == 0 else np.asarray(v, np.float64)
           for k, v in stats.items()}
  out, loss = {}, None
  for objective in objectives:
    fields = objective.metrics(stats)
    out.update(fields)
    term = fields[f'{objective.name}_loss']
    loss = term if loss is None else loss + term
  out['loss'] = loss
  return out
