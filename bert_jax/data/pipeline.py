"""In-memory pretraining data: epochs of pairs and fresh masks, resumable to the exact batch.

Epoch e of the training stream is a pure function of (documents, seed, e): pairs are built and
masked with a generator seeded by (seed, e) (dynamic masking: every epoch sees fresh pairs and
masks), then cut into batches. The position is (epoch, batch index), saved in checkpoints, so a
resumed run sees exactly the batches an uninterrupted one would. The paper-scale streaming
pipeline reuses the same pure functions from data/pretraining.py.
"""

import threading

import numpy as np

from bert_jax.core import errors
from bert_jax.data import pretraining

_TRAIN_STREAM, _EVAL_STREAM, _SPLIT_STREAM = 1, 2, 3
# Batches of an epoch read before the next epoch starts building beside them: a run that stops
# within its first few batches (a smoke test, a short resume) builds no epoch it will not read.
BUILD_AHEAD_AFTER = 8


def split_documents(documents, eval_fraction: float, seed: int):
  """Deterministic (train, eval) split of documents; eval gets at least 2 when it can."""
  order = np.random.default_rng([seed, _SPLIT_STREAM]).permutation(len(documents))
  num_eval = int(round(eval_fraction * len(documents)))
  if eval_fraction > 0:
    num_eval = min(max(num_eval, 2), len(documents) - 1)
  eval_ids = set(order[:num_eval].tolist())
  train = [d for i, d in enumerate(documents) if i not in eval_ids]
  held_out = [d for i, d in enumerate(documents) if i in eval_ids]
  return train, held_out


def create_instances(documents, rng: np.random.Generator, settings: pretraining.MaskingSettings):
  """One pass over `documents`: the shuffled pairs, single segments or FULL-SENTENCES rows
  (settings.rows) before masking."""
  if settings.rows == 'full_sentences':
    return pretraining.create_full_sentence_instances(
        documents, rng, max_seq_length=settings.max_seq_length, separator=settings.special.sep)
  return pretraining.create_instances(
      documents, rng, max_seq_length=settings.max_seq_length,
      short_seq_prob=settings.short_seq_prob, nsp=settings.nsp,
      separators=settings.special.separators, pair_kind=settings.pair_kind)


def make_features(instance, rng: np.random.Generator, settings: pretraining.MaskingSettings):
  """One instance, masked as the settings say -> its fixed-shape features."""
  return pretraining.make_features(
      instance, rng, special=settings.special, vocab_size=settings.vocab_size,
      max_seq_length=settings.max_seq_length, max_predictions=settings.max_predictions,
      mask_rate=settings.mask_rate, mask_token_fraction=settings.mask_token_fraction,
      random_token_fraction=settings.random_token_fraction,
      keep_fraction=settings.keep_fraction, is_continuation=settings.is_continuation,
      max_ngram=settings.max_ngram, spans=settings.spans, span_p=settings.span_p,
      max_span=settings.max_span, span_keys=settings.span_keys)


def build_examples(documents, rng: np.random.Generator, settings: pretraining.MaskingSettings):
  """One pass over `documents`: shuffled pairs (or rows) -> masked fixed-shape features,
  stacked."""
  features = [make_features(instance, rng, settings)
              for instance in create_instances(documents, rng, settings)]
  if not features:
    return None
  return pretraining.stack_features(features)


class PretrainingStream:
  """The training stream: batches of epoch e come from pairs and masks seeded by (seed, e).

  build(documents, rng, settings) makes one pass's stacked features: build_examples, or for a
  cross-lingual corpus data/crosslingual.py's.
  """

  # identity.digest of the data the batches come from, set by the mode that reads the corpus;
  # saved with each checkpoint so that a resume on other data is refused.
  data_sha256 = ''

  def __init__(self, documents, settings: pretraining.MaskingSettings, batch_size: int, seed: int,
               build=build_examples):
    self.documents = documents
    self.settings = settings
    self.batch_size = batch_size
    self.seed = seed
    self.build = build
    self._epoch = None
    self._examples = None
    self._ahead = None  # _EpochAhead: the next epoch, building in a thread.

  def _build_epoch(self, epoch: int):
    rng = np.random.default_rng([self.seed, _TRAIN_STREAM, epoch])
    return self.build(self.documents, rng, self.settings)

  def epoch_examples(self, epoch: int):
    """All examples of `epoch` (cached for the current epoch; the one built ahead if it is)."""
    if self._epoch != epoch:
      ahead, self._ahead = self._ahead, None
      self._examples = ahead.result() if ahead and ahead.epoch == epoch else self._build_epoch(
          epoch)
      self._epoch = epoch
    return self._examples

  def build_ahead(self, epoch: int) -> None:
    """Starts building `epoch` in a thread, for epoch_examples to take when it gets there.

    An epoch is a pure function of (documents, seed, epoch), so it is the same built here or
    there; built while the device trains on the epoch before, its seconds (pairing and masking
    every document) no longer stop the steps at each epoch's start. Meanwhile two epochs are in
    memory."""
    if self._epoch == epoch or (self._ahead and self._ahead.epoch == epoch):
      return
    self._ahead = _EpochAhead(epoch, lambda: self._build_epoch(epoch))

  def batches_per_epoch(self, epoch: int) -> int:
    examples = self.epoch_examples(epoch)
    return 0 if examples is None else len(examples['input_ids']) // self.batch_size

  def batches(self, position: dict):
    """Yields (batch, position after it) from `position` = {'epoch', 'batch'} on, forever."""
    epoch, index = int(position['epoch']), int(position['batch'])
    while True:
      num_batches = self.batches_per_epoch(epoch)
      if num_batches == 0:
        # A ConfigError: the run ends with one line naming the keys to change.
        raise errors.ConfigError(
            f'The training documents yield fewer than batch_size={self.batch_size} examples '
            'per epoch; use a larger corpus or a smaller train.batch_size.')
      while index < num_batches:
        examples = self.epoch_examples(epoch)
        window = slice(index * self.batch_size, (index + 1) * self.batch_size)
        index += 1
        if index == min(BUILD_AHEAD_AFTER, num_batches):
          self.build_ahead(epoch + 1)
        yield ({k: v[window] for k, v in examples.items()}, {'epoch': epoch, 'batch': index})
      epoch, index = epoch + 1, 0


class _EpochAhead:
  """An epoch's examples built in a daemon thread (a run that ends first does not wait for it);
  result() waits for them and raises what the build raised, where the stream reads them."""

  def __init__(self, epoch: int, build):
    self.epoch = epoch
    self._outcome = None

    def run():
      try:
        self._outcome = (build(), None)
      except BaseException as e:  # pylint: disable=broad-except
        self._outcome = (None, e)
    self._thread = threading.Thread(target=run, name=f'epoch-{epoch}', daemon=True)
    self._thread.start()

  def result(self):
    self._thread.join()
    examples, error = self._outcome
    if error is not None:
      raise error
    return examples


def eval_batches(documents, settings: pretraining.MaskingSettings, batch_size: int,
                 num_batches: int, seed: int, build=build_examples) -> list[dict]:
  """A fixed held-out set: the same pairs and masks at every evaluation (`build` as
  PretrainingStream's)."""
  rng = np.random.default_rng([seed, _EVAL_STREAM])
  parts, count = [], 0
  for _ in range(1000):  # Passes over the held-out documents until there are enough examples.
    examples = build(documents, rng, settings)
    if examples is None:
      break
    parts.append(examples)
    count += len(examples['input_ids'])
    if count >= batch_size * num_batches:
      break
  if count < batch_size:
    raise errors.ConfigError(
        f'The held-out documents ({len(documents)}) yield {count} examples, fewer than '
        f'train.batch_size={batch_size}; raise data.eval_fraction or use a larger corpus.')
  merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
  usable = min(num_batches, count // batch_size)
  return [{k: v[i * batch_size:(i + 1) * batch_size] for k, v in merged.items()}
          for i in range(usable)]


def most_frequent_label(examples) -> int:
  """The token most often masked in `examples`: the always-predict-it baseline's guess (0 when
  nothing is masked: unmasked rows have no MLM baseline)."""
  labels = examples['masked_lm_ids'][examples['masked_lm_weights'] > 0]
  return int(np.bincount(labels).argmax()) if len(labels) else 0


def baseline_accuracy(batches, token: int) -> float:
  """MLM accuracy of always predicting `token` on `batches`."""
  hits = sum(float(((b['masked_lm_ids'] == token) * b['masked_lm_weights']).sum())
             for b in batches)
  total = sum(float(b['masked_lm_weights'].sum()) for b in batches)
  return hits / max(total, 1.0)
