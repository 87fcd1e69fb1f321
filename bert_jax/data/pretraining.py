"""Pretraining examples with the semantics of BERT's create_pretraining_data.py.

Pure numpy functions of (tokens, rng, settings): sentence pairs with
next-sentence labels (or single segments when NSP is off), truncation, the
`[CLS] A [SEP] B [SEP]` layout (RoBERTa's `<s> A </s></s> B </s>` with a byte-level BPE
vocab), masked-LM corruption and fixed-shape features. Two more kinds of rows for BERT's family:
ALBERT's sentence-order pairs (the objectives' pair_kind 'order') and RoBERTa's FULL-SENTENCES
rows (data.rows='full_sentences').
A corpus is `documents: list[list[np.ndarray]]`, each document a list of
sentences, each sentence a 1-D int32 array of token ids.
"""

import dataclasses

import numpy as np

from bert_jax import objectives
from bert_jax.core.errors import ConfigError
from bert_jax.data import masking

# Draws at finding a document other than the current one, as the original.
_RANDOM_DOCUMENT_TRIES = 10


@dataclasses.dataclass(frozen=True)
class SpecialIds:
  """A tokenizer's special tokens (BERT's names; RoBERTa's <pad> <unk> <s> </s> <mask>) and how
  they lay out a row."""
  pad: int  # [PAD]: fills sequences up to max_seq_length.
  unk: int  # [UNK]
  cls: int  # [CLS]: first token of every example.
  sep: int  # [SEP]: ends each segment.
  mask: int  # [MASK]: replaces most tokens chosen for prediction.
  separators: int = 1  # [SEP]s after segment A of a pair: 2 in RoBERTa's <s> A </s></s> B </s>.
  # Whether a random replacement may draw these ids: the original BERT draws any vocab id,
  # RoBERTa (fairseq) never a special one.
  draws_specials: bool = True
  # Whether a fine-tuning pair's B carries segment id 1 (BERT, ALBERT); RoBERTa's tokenizer gives
  # every token 0, and its one segment row reads the same either way.
  segment_b: bool = True

  def ids(self) -> np.ndarray:
    """The special ids, sorted, each once."""
    return np.unique(np.array([self.pad, self.unk, self.cls, self.sep, self.mask], np.int64))

  def overhead(self, pair: bool) -> int:
    """Special tokens in a row: [CLS] A [SEP], or [CLS] A [SEP] B [SEP] (RoBERTa: one more)."""
    return 2 + self.separators if pair else 2


@dataclasses.dataclass(frozen=True, kw_only=True)
class MaskingSettings:
  """How pairs are made and masked, from the config: shared by both readers (data/pipeline.py
  in memory, data/batching.py streaming, whose StreamSettings adds the batch layout)."""
  special: SpecialIds
  vocab_size: int  # Random replacements are drawn from [0, vocab_size).
  max_seq_length: int
  max_predictions: int
  nsp: bool
  short_seq_prob: float
  mask_rate: float  # 0: no token is chosen, the rows stay unmasked.
  mask_token_fraction: float
  random_token_fraction: float  # The rest of the predicted tokens is kept.
  is_continuation: np.ndarray | None = None  # Whole-word masking when set.
  # With nsp (sentence pairs): 'next', NSP's pairs, or 'order', SOP's (ObjectiveSet.pair_kind).
  pair_kind: str = 'next'
  max_ngram: int = 1  # Spans of up to this many words are masked together (ALBERT: 3).
  rows: str = 'segments'  # config.data.rows: 'segments' or 'full_sentences' (RoBERTa).
  spans: str = ''  # 'geometric': SpanBERT's span masking; '': off.
  span_p: float = 0.2  # With spans: the span length's geometric parameter.
  max_span: int = 10  # With spans: the longest span, in words.
  # Whether batches carry masking.SPAN_KEYS (an objective reads them: the span boundary one).
  span_keys: bool = False

  @classmethod
  def from_config(cls, config, special: SpecialIds, vocab_size: int,
                  is_continuation: np.ndarray, run_objectives: objectives.ObjectiveSet,
                  **more):
    """config.data and config.masking -> settings (`more`: a subclass's own fields). A run
    none of whose objectives masks inputs (clm) gets mask_rate 0: unmasked rows.
    run_objectives: the config's objectives, objectives.resolve(config)."""
    masked = run_objectives.masks_inputs
    check_rows(config, run_objectives)
    return cls(
        special=special, vocab_size=vocab_size, max_seq_length=config.data.max_seq_length,
        max_predictions=config.data.max_predictions_per_seq,
        nsp=run_objectives.sentence_pairs,
        short_seq_prob=config.data.short_seq_prob,
        mask_rate=config.masking.rate if masked else 0.0,
        mask_token_fraction=config.masking.mask_token_fraction,
        random_token_fraction=config.masking.random_token_fraction,
        is_continuation=is_continuation if masked and config.masking.whole_word else None,
        pair_kind=run_objectives.pair_kind or 'next', max_ngram=config.masking.max_ngram,
        rows=config.data.rows, spans=config.masking.spans if masked else '',
        span_p=config.masking.span_p, max_span=config.masking.max_span,
        span_keys=reads_span_keys(run_objectives), **more)

  @property
  def keep_fraction(self) -> float:
    return 1.0 - self.mask_token_fraction - self.random_token_fraction


def reads_span_keys(run_objectives: objectives.ObjectiveSet) -> bool:
  """Whether one of the run's objectives reads masking.SPAN_KEYS (batches then carry them)."""
  spec = objectives.batch_spec(run_objectives.objectives, objectives.BatchShape(1, 1))
  return any(key in spec for key in masking.SPAN_KEYS)


def check_rows(config, run_objectives: objectives.ObjectiveSet) -> None:
  """data.rows='full_sentences' makes single rows afresh each epoch: ConfigError for what needs
  pairs, packing or fixed masks (run_objectives: objectives.resolve(config))."""
  if config.data.rows != 'full_sentences':
    return
  if run_objectives.sentence_pairs:
    raise ConfigError(
        f"config.data.rows='full_sentences' fills rows with sentences across documents, but "
        f'config.objectives={config.objectives!r} trains on sentence pairs; use '
        "objectives without a pair objective (RoBERTa: 'mlm'), or data.rows='segments'.")
  for key, why in (('packing', 'its rows are full already'),
                   ('dupe_factor', 'its rows change with each epoch\'s document order, so no '
                    'mask can stay fixed')):
    if config.data[key]:
      raise ConfigError(
          f"config.data.{key}={config.data[key]!r} with config.data.rows='full_sentences': "
          f'{why}; set config.data.{key} to {type(config.data[key])()!r}.')


@dataclasses.dataclass(frozen=True)
class Instance:
  """One example before masking: segments A and B and the NSP label."""
  tokens_a: np.ndarray  # [len_a] int32
  tokens_b: np.ndarray  # [len_b] int32; empty when NSP is off.
  # Label 1 of the pair: NSP's NotNext (B comes from another document), or SOP's swapped pair
  # (ALBERT's create_pretraining_data.py keeps the name for it too).
  is_random_next: bool


def create_instances(documents, rng, *, max_seq_length, short_seq_prob, nsp, separators=1,
                     pair_kind='next'):
  """Returns one pass of instances over all documents, shuffled."""
  instances = []
  for doc_index in range(len(documents)):
    instances.extend(create_instances_from_document(
        documents, doc_index, rng, max_seq_length=max_seq_length,
        short_seq_prob=short_seq_prob, nsp=nsp, separators=separators, pair_kind=pair_kind))
  return [instances[k] for k in rng.permutation(len(instances))]


def create_instances_from_document(
    documents, doc_index, rng, *, max_seq_length, short_seq_prob, nsp, separators=1,
    pair_kind='next'):
  """Returns the instances one pass makes from documents[doc_index]; `separators`: the [SEP]s
  after segment A of a pair (SpecialIds.separators); `pair_kind` (with nsp): 'next', NSP's
  pairs, or 'order', SOP's."""
  document = documents[doc_index]
  # Room left for text after [CLS] A [SEP] B [SEP], or [CLS] A [SEP].
  max_num_tokens = max_seq_length - (2 + separators if nsp else 2)
  # Drawn once per document, as the original does.
  target_length = _target_length(rng, max_num_tokens, short_seq_prob)
  instances = []
  chunk, chunk_length = [], 0
  i = 0
  while i < len(document):
    chunk.append(document[i])
    chunk_length += len(document[i])
    if i == len(document) - 1 or chunk_length >= target_length:
      if nsp and pair_kind == 'order':
        instance, num_unused = _ordered_pair(chunk, max_num_tokens, rng), 0
      elif nsp:
        instance, num_unused = _sentence_pair(
            documents, doc_index, chunk, target_length, max_num_tokens, rng)
        # A NotNext pair leaves the chunk's tail unused: revisit, not waste it.
        i -= num_unused
      else:
        instance = _single_segment(chunk, max_num_tokens, rng)
      if instance is not None:
        instances.append(instance)
      chunk, chunk_length = [], 0
    i += 1
  return instances


def _target_length(rng, max_num_tokens, short_seq_prob):
  """Draws the length that a document's chunks fill up to."""
  # Mostly full sequences, since padding is wasted compute; sometimes short
  # ones, so that short fine-tuning inputs are not out of distribution.
  if rng.random() < short_seq_prob:
    return int(rng.integers(2, max_num_tokens, endpoint=True))
  return max_num_tokens


def _sentence_pair(documents, doc_index, chunk, target_length, max_num_tokens,
                   rng):
  """Returns (instance or None, sentences of the chunk left unused)."""
  a_end = 1
  if len(chunk) >= 2:
    a_end = int(rng.integers(1, len(chunk) - 1, endpoint=True))
  tokens_a = _concat(chunk[:a_end])
  tokens_b = None
  if len(chunk) == 1 or rng.random() < 0.5:
    tokens_b = _random_document_text(
        documents, doc_index, target_length - len(tokens_a), rng)
  if tokens_b is not None:
    is_random_next, num_unused = True, len(chunk) - a_end
  elif len(chunk) >= 2:
    # IsNext; also when NotNext finds no other document (a one-document corpus).
    tokens_b, is_random_next, num_unused = _concat(chunk[a_end:]), False, 0
  else:
    return None, 0
  tokens_a, tokens_b = truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
  # The original asserts here; empty sentences in the corpus could trip it.
  if len(tokens_a) == 0 or len(tokens_b) == 0:
    return None, num_unused
  return Instance(tokens_a, tokens_b, is_random_next), num_unused


def _ordered_pair(chunk, max_num_tokens, rng):
  """SOP's pair of the chunk (ALBERT's create_pretraining_data.py without random_next_sentence):
  A = its first k sentences, B = the rest, swapped (label 1) at p=1/2; None when it cannot make
  two segments."""
  # A one-sentence chunk makes no pair: ALBERT's code gives it a random document's B (NSP's
  # NotNext), which SOP does not learn from; transformers' SOP dataset skips it, as here.
  if len(chunk) < 2:
    return None
  a_end = int(rng.integers(1, len(chunk) - 1, endpoint=True))
  tokens_a, tokens_b = _concat(chunk[:a_end]), _concat(chunk[a_end:])
  swapped = bool(rng.random() < 0.5)
  if swapped:
    tokens_a, tokens_b = tokens_b, tokens_a
  # Truncated after the swap, as ALBERT's code does.
  tokens_a, tokens_b = truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
  if len(tokens_a) == 0 or len(tokens_b) == 0:
    return None
  return Instance(tokens_a, tokens_b, swapped)


def _random_document_text(documents, doc_index, target_b_length, rng):
  """Returns sentences of another document, from a random start up to target_b_length tokens."""
  for _ in range(_RANDOM_DOCUMENT_TRIES):
    random_index = int(rng.integers(len(documents)))
    # Read once: a streamed corpus decodes the document on each access.
    document = documents[random_index] if random_index != doc_index else None
    if document is not None and len(document):
      break
  else:
    # The original would then use the current document and still say NotNext.
    return None
  sentences, length = [], 0
  for sentence in document[int(rng.integers(len(document))):]:
    sentences.append(sentence)
    length += len(sentence)
    if length >= target_b_length:
      break
  return _concat(sentences)


def _single_segment(chunk, max_num_tokens, rng):
  """Returns the chunk as segment A alone (no NSP), or None when empty."""
  tokens_a, _ = truncate_seq_pair(
      _concat(chunk), np.zeros(0, np.int32), max_num_tokens, rng)
  if len(tokens_a) == 0:
    return None
  return Instance(tokens_a, np.zeros(0, np.int32), False)


def sentence_pieces(document, room: int) -> list[np.ndarray]:
  """A document's non-empty sentences for FULL-SENTENCES rows: one longer than `room` (the row's
  tokens between [CLS] and [SEP]) is cut into pieces of `room` tokens, the only way a sentence
  spans rows."""
  pieces = []
  for sentence in document:
    pieces.extend(sentence[start:start + room] for start in range(0, len(sentence), room))
  return pieces


class FullSentenceRow:
  """One FULL-SENTENCES row being filled (RoBERTa, section 4.2): whole sentences in order, a
  separator ([SEP], </s>) before each document's first sentence but the row's first, up to
  max_seq_length with [CLS] and the closing [SEP]."""

  def __init__(self, max_seq_length: int, separator: int):
    self.room, self.separator = max_seq_length - 2, separator
    self.parts, self.length = [], 0

  def add(self, piece: np.ndarray, starts_document: bool) -> bool:
    """Appends the piece when it fits (a piece always fits an empty row); False when not."""
    separated = bool(starts_document and self.parts)
    if self.parts and self.length + separated + len(piece) > self.room:
      return False
    if separated:
      self.parts.append(np.array([self.separator], np.int32))
    self.parts.append(piece)
    self.length += separated + len(piece)
    return True

  def instance(self) -> Instance:
    """The row as a single segment (segment id 0 throughout)."""
    return Instance(_concat(self.parts), np.zeros(0, np.int32), False)


def create_full_sentence_instances(documents, rng, *, max_seq_length, separator):
  """One pass of FULL-SENTENCES rows over the documents, in a random order, shuffled. No short
  rows are drawn (RoBERTa trains on full-length rows only); the pass's last row may be short."""
  instances = []
  row = FullSentenceRow(max_seq_length, separator)
  for doc_index in rng.permutation(len(documents)):
    for index, piece in enumerate(sentence_pieces(documents[doc_index], row.room)):
      if not row.add(piece, index == 0):
        instances.append(row.instance())
        row = FullSentenceRow(max_seq_length, separator)
        row.add(piece, True)
  if row.parts:
    instances.append(row.instance())
  return [instances[k] for k in rng.permutation(len(instances))]


def _concat(sentences):
  """Joins sentences into one int32 array."""
  if not sentences:
    return np.zeros(0, np.int32)
  return np.concatenate(sentences).astype(np.int32, copy=False)


def truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
  """Trims the longer of A and B a token at a time, front or back at random."""
  cut_a, cut_b = _truncation_counts(len(tokens_a), len(tokens_b), max_num_tokens)
  return _trim(tokens_a, cut_a, rng), _trim(tokens_b, cut_b, rng)


def _truncation_counts(len_a, len_b, max_num_tokens):
  """Returns how many tokens the original's one-at-a-time loop cuts from A and B."""
  excess = max(0, len_a + len_b - max_num_tokens)
  # The longer one shrinks until the two are level...
  level = min(excess, abs(len_a - len_b))
  rest = excess - level
  # ...then a tie cuts B, so the cuts alternate B, A, B, ...
  cut_a = (level if len_a > len_b else 0) + rest // 2
  cut_b = (0 if len_a > len_b else level) + rest - rest // 2
  return cut_a, cut_b


def _trim(tokens, num_cut, rng):
  """Returns a copy without num_cut tokens, each cut from the front or back at p=1/2."""
  # The side of each cut is an independent coin, so the front cuts are binomial.
  num_front = int(rng.binomial(num_cut, 0.5)) if num_cut else 0
  return np.array(tokens[num_front:len(tokens) - (num_cut - num_front)],
                  dtype=np.int32)


def assemble(instance, special):
  """Returns (input_ids, segment_ids) of [CLS] A [SEP] B [SEP] ([CLS] A [SEP] if B is empty;
  RoBERTa's <s> A </s></s> B </s>, the second </s> in B's segment as fairseq prepends it to B)."""
  first = np.concatenate(
      [[special.cls], instance.tokens_a, [special.sep]]).astype(np.int32)
  second = np.zeros(0, np.int32)
  if len(instance.tokens_b):
    second = np.concatenate([[special.sep] * (special.separators - 1), instance.tokens_b,
                             [special.sep]]).astype(np.int32)
  input_ids = np.concatenate([first, second])
  segment_ids = np.repeat(np.array([0, 1], np.int32), [len(first), len(second)])
  return input_ids, segment_ids


def make_features(instance, rng, *, special, vocab_size, max_seq_length,
                  max_predictions, mask_rate, mask_token_fraction,
                  random_token_fraction, keep_fraction, is_continuation=None, max_ngram=1,
                  spans='', span_p=0.2, max_span=10, span_keys=False):
  """Returns the padded, fixed-shape model inputs and targets of one instance (span_keys: with
  masking.span_boundaries' keys)."""
  input_ids, segment_ids = assemble(instance, special)
  if len(input_ids) > max_seq_length:
    raise ValueError(f'Instance of {len(input_ids)} tokens exceeds '
                     f'max_seq_length={max_seq_length}.')
  masked_ids, positions, labels = masking.mask_tokens(
      input_ids, rng, special=special, vocab_size=vocab_size,
      mask_rate=mask_rate, max_predictions=max_predictions,
      mask_token_fraction=mask_token_fraction,
      random_token_fraction=random_token_fraction, keep_fraction=keep_fraction,
      is_continuation=is_continuation, max_ngram=max_ngram, spans=spans, span_p=span_p,
      max_span=max_span)
  return padded_features(masked_ids, segment_ids, positions, labels, special=special,
                         max_seq_length=max_seq_length, max_predictions=max_predictions,
                         is_random_next=instance.is_random_next, span_keys=span_keys)


def padded_features(masked_ids, segment_ids, positions, labels, *, special, max_seq_length,
                    max_predictions, is_random_next=False, span_keys=False, **per_token):
  """One row's masked ids and segment ids [n], predictions' positions and labels [p] -> the
  fixed-shape features; `per_token` ids [n] (cross-lingual rows' position_ids and
  language_ids) are padded with 0 to [S] as well."""
  features = {
      'input_ids': _pad(masked_ids, max_seq_length, special.pad),  # [S]
      'input_mask': _pad(np.ones(len(masked_ids), np.int32), max_seq_length, 0),
      'segment_ids': _pad(segment_ids, max_seq_length, 0),  # [S]
      'masked_lm_positions': _pad(positions, max_predictions, 0),  # [P]
      'masked_lm_ids': _pad(labels, max_predictions, special.pad),  # [P]
      'masked_lm_weights': _pad(
          np.ones(len(positions), np.float32), max_predictions, 0.0),  # [P]
      'next_sentence_labels': np.array(int(is_random_next), np.int32),
  }
  if span_keys:
    features.update(masking.span_boundaries(features['masked_lm_positions'],
                                            features['masked_lm_weights']))  # [P] each
  for key, values in per_token.items():
    features[key] = _pad(np.asarray(values, np.int32), max_seq_length, 0)  # [S]
  return features


def _pad(values, length, value):
  """Returns values padded with value to length."""
  padded = np.full(length, value, dtype=values.dtype)
  padded[:len(values)] = values
  return padded


def stack_features(features):
  """Stacks per-example feature dicts along a new leading batch axis."""
  return {key: np.stack([f[key] for f in features]) for key in features[0]}
