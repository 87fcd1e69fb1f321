"""SentencePiece unigram tokenization (ALBERT's) through the `sentencepiece` package: a .model.

Text is prepared as ALBERT's tokenizer prepares it (transformers' AlbertTokenizer, whose
normalizers this module uses): `` and '' become ", and with config.data.lowercase accents are
stripped (NFKD) and letters lowercased (do_lower_case=True, keep_accents=False); the model then
applies its own normalization. ALBERT's special pieces are [CLS] [SEP] [MASK] <pad> <unk>; a
model trained here has them at ids 2, 3, 4, 0, 1 as ALBERT's 30k-clean.model. Rows are laid out
as BERT's: `[CLS] A [SEP] B [SEP]`.
"""

import hashlib
import os

from absl import logging
import numpy as np
import sentencepiece
from tokenizers import normalizers

from bert_jax.data.pretraining import SpecialIds

MODEL_NAME = 'spiece.model'
_CONTROL_SYMBOLS = ('[CLS]', '[SEP]', '[MASK]')
_PAD, _UNK = '<pad>', '<unk>'
# ALBERT's spm_train settings, less its user-defined punctuation pieces (transformers' ALBERT
# tokenizer splits those differently from SentencePiece) and with a soft vocab limit, so a small
# corpus yields a smaller vocab rather than an error.
TRAINER_SETTINGS = dict(
    model_type='unigram', pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
    control_symbols=','.join(_CONTROL_SYMBOLS), character_coverage=0.99995,
    normalization_rule_name='nmt_nfkc', input_sentence_size=10_000_000,
    shuffle_input_sentence=True, hard_vocab_limit=False)


def settings_key(settings: dict) -> str:
  """What a trained model depends on besides the corpus, its size and casing: the cache key."""
  return ','.join(f'{k}={v}' for k, v in sorted(settings.items()))


TRAINING_SETTINGS = settings_key(TRAINER_SETTINGS)
# ALBERT's create_pretraining_data._is_start_piece: these single characters begin a word.
_START_PUNCTUATION = frozenset('!"#$%&"()*+,-./:;?@[\\]^_`{|}~')
_WORD_START = '▁'
_ENCODE_CHUNK = 50_000


def _normalizer(lowercase: bool, replace_quotes: bool = True):
  """ALBERT's preparation of text before the model (AlbertTokenizer's normalizers); without
  replace_quotes, XLM-R's (`` and '' stay)."""
  steps = [normalizers.Replace('``', '"'), normalizers.Replace("''", '"')] if replace_quotes else []
  if lowercase:
    steps += [normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase()]
  return normalizers.Sequence(steps)


class SentencePieceTokenizer:
  """ALBERT's tokenizer over a SentencePiece .model."""
  kind = 'sentencepiece'
  model_name = MODEL_NAME  # What a directory keeps the .model as.
  extra_ids = 0  # Ids beyond the model's pieces.
  replace_quotes = True  # `` and '' become " (ALBERT's preparation).

  def __init__(self, model_file: str, lowercase: bool):
    path = os.path.expanduser(model_file)
    if not os.path.isfile(path):
      raise FileNotFoundError(f'{model_file!r} is not a file: SentencePiece reads a .model '
                              '(ALBERT: 30k-clean.model, transformers: spiece.model).')
    self._model_file = path
    try:
      self._sp = sentencepiece.SentencePieceProcessor(model_file=path)
    except (RuntimeError, OSError) as e:
      raise ValueError(f'{model_file!r} is not a SentencePiece model ({str(e).strip()}).') from e
    model_pieces = [self._sp.id_to_piece(i) for i in range(self._sp.get_piece_size())]
    self._pieces, self._special = self._layout(model_file, model_pieces)
    specials = set(self._special.ids().tolist())
    if not lowercase and not any(any(c.isupper() for c in piece)
                                 for i, piece in enumerate(self._pieces) if i not in specials):
      raise ValueError(
          f'{model_file!r} holds no piece with a capital letter: it was trained on lowercased '
          'text (or folds case), so config.data.lowercase=False would not keep the case; set '
          'config.data.lowercase=True.')
    self._normalizer = _normalizer(lowercase, self.replace_quotes)
    self._characters = {}  # Character -> as the normalizer prepares it.
    self.lowercase = lowercase

  def _layout(self, model_file: str, model_pieces: list[str]) -> tuple[list[str], SpecialIds]:
    """(the piece of each of our ids, the special ids): ALBERT's, the model's own ids."""
    index = {piece: i for i, piece in enumerate(model_pieces)}
    missing = [piece for piece in (*_CONTROL_SYMBOLS, _PAD, _UNK) if piece not in index]
    if missing:
      raise ValueError(f'{model_file!r} lacks the pieces {missing}; ALBERT needs [CLS], [SEP], '
                       '[MASK] (control symbols), <pad> and <unk>.' + (
                           " It has fairseq's <s> and </s> (XLM-R's sentencepiece.bpe.model): "
                           "use config.data.tokenizer='sentencepiece_fairseq'."
                           if model_pieces[1:3] == ['<s>', '</s>'] else ''))
    return model_pieces, SpecialIds(pad=index[_PAD], unk=index[_UNK], cls=index['[CLS]'],
                                    sep=index['[SEP]'], mask=index['[MASK]'],
                                    draws_specials=False)

  def _from_model_ids(self, ids: np.ndarray) -> np.ndarray:
    """Our ids of the model's (int32): the same here."""
    return ids

  @property
  def vocab_size(self) -> int:
    return len(self._pieces)

  @property
  def vocab_file(self) -> str:
    """The .model file."""
    return self._model_file

  @property
  def special(self) -> SpecialIds:
    """Ids of <pad>, <unk>, [CLS], [SEP] and [MASK]."""
    return self._special

  def files(self) -> dict[str, str]:
    return {self.model_name: self._model_file}

  def _ids(self, texts: list[str]) -> list[np.ndarray]:
    """The model's ids of already prepared texts."""
    ids = []
    for start in range(0, len(texts), _ENCODE_CHUNK):
      ids += [self._from_model_ids(np.asarray(x, np.int32)) for x in
              self._sp.encode(texts[start:start + _ENCODE_CHUNK], return_type='numpy')]
    return ids

  def encode_sentences(self, sentences: list[str]) -> list[np.ndarray]:
    """Returns int32 ids per sentence, without special tokens."""
    return self._ids([self._normalizer.normalize_str(s) for s in sentences])

  def encode_with_offsets(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per text: (int32 ids [n], int32 character spans [n, 2] into the original text), a
    piece's leading spaces ('▁') left out of its span."""
    out = []
    for text in texts:
      prepared, starts, ends = self._aligned(text)
      encoded = self._sp.encode(prepared, return_type='offset_mapping')
      spans = np.zeros((len(encoded['ids']), 2), np.int32)
      for k, (begin, end) in enumerate(encoded['offsets']):
        while begin < end and prepared[begin].isspace():
          begin += 1
        if begin < end:
          spans[k] = (starts[begin], ends[end - 1])
        else:  # A piece of spaces alone ('▁') gets the empty span where its spaces end.
          spans[k] = (starts[begin] if begin < len(starts) else len(text),) * 2
      out.append((self._from_model_ids(np.asarray(encoded['ids'], np.int32)), spans))
    return out

  def _aligned(self, text: str) -> tuple[str, np.ndarray, np.ndarray]:
    """(the prepared text, then per prepared character the span [start, end) of the original
    characters it comes from)."""
    if text.isascii() and not (self.replace_quotes and ('``' in text or "''" in text)):
      positions = np.arange(len(text) + 1)
      return (text.lower() if self.lowercase else text), positions[:-1], positions[1:]
    parts, starts, ends = [], [], []
    i = 0
    while i < len(text):
      width = 2 if self.replace_quotes and text[i:i + 2] in ('``', "''") else 1
      part = '"' if width == 2 else self._characters.get(text[i])
      if part is None:  # The normalizer's steps act character by character.
        part = self._characters[text[i]] = self._normalizer.normalize_str(text[i])
      parts.append(part)
      starts += [i] * len(part)
      ends += [i + width] * len(part)
      i += width
    return ''.join(parts), np.asarray(starts, np.int64), np.asarray(ends, np.int64)

  def encode_words(self, sentences: list[list[str]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per pre-split sentence: (int32 ids [n], int32 index of the word each piece belongs to
    [n]); each word is encoded on its own, so it begins with '▁'."""
    words = [self._normalizer.normalize_str(w) for sentence in sentences for w in sentence]
    pieces = iter(self._ids(words))
    out = []
    for sentence in sentences:
      ids = [next(pieces) for _ in sentence]
      word_of = np.repeat(np.arange(len(ids), dtype=np.int32), [len(x) for x in ids])
      out.append((np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, np.int32),
                  word_of))
    return out

  def id_to_token(self, index: int) -> str:
    return self._pieces[index]

  def decode(self, ids) -> str:
    """The text of `ids`, '▁' read as a space; special pieces are shown as such."""
    return ''.join(self._pieces[int(i)] for i in ids).replace(_WORD_START, ' ').strip()

  def is_continuation(self) -> np.ndarray:
    """A bool per id: True for pieces that continue a word, as ALBERT's whole-word masking tells
    them (a piece begins a word with '▁' or '<', or as a punctuation mark)."""
    special = set(self._special.ids().tolist())
    return np.array([not (piece.startswith(_WORD_START) or piece.startswith('<')
                          or piece in _START_PUNCTUATION or index in special)
                     for index, piece in enumerate(self._pieces)], dtype=bool)

  def vocab_hash(self) -> str:
    """sha256 (hex) of the .model file."""
    with open(self._model_file, 'rb') as f:
      return hashlib.sha256(f.read()).hexdigest()


def load(model_file: str, lowercase: bool) -> SentencePieceTokenizer:
  return SentencePieceTokenizer(model_file, lowercase)


def train(documents: list[list[str]], vocab_size: int, lowercase: bool,
          output_dir: str) -> SentencePieceTokenizer:
  """Trains a unigram model on the prepared sentences, writes output_dir/spiece.model, loads it."""
  return train_model(SentencePieceTokenizer, TRAINER_SETTINGS, documents, vocab_size,
                     lowercase, output_dir)


def train_model(tokenizer_class, settings: dict, documents: list[list[str]], vocab_size: int,
                lowercase: bool, output_dir: str):
  """Trains a unigram model with the trainer `settings` on the prepared sentences, so that
  `tokenizer_class` (its `extra_ids` past the model's pieces) has `vocab_size` ids at most; writes
  output_dir/tokenizer_class.model_name and loads it."""
  normalizer = _normalizer(lowercase, tokenizer_class.replace_quotes)
  sentences = [normalizer.normalize_str(s) for document in documents for s in document]
  sentences = [s for s in sentences if s.strip()]
  if not sentences:
    raise ValueError('Cannot train a tokenizer on a corpus without sentences.')
  output_dir = os.path.expanduser(output_dir)
  os.makedirs(output_dir, exist_ok=True)
  prefix = os.path.join(output_dir, f'.spiece.{os.getpid()}')
  path = os.path.join(output_dir, tokenizer_class.model_name)
  pieces = vocab_size - tokenizer_class.extra_ids
  try:
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_prefix=prefix, vocab_size=pieces,
        num_threads=os.cpu_count() or 1, minloglevel=2, **settings)
    os.replace(f'{prefix}.model', path)
  except RuntimeError as e:
    raise ValueError(f'SentencePiece could not train a {pieces}-piece model on '
                     f'{len(sentences)} sentences: {str(e).strip()}') from e
  finally:
    for leftover in (f'{prefix}.model', f'{prefix}.vocab'):
      if os.path.exists(leftover):
        os.unlink(leftover)
  tokenizer = tokenizer_class(path, lowercase)
  logging.info('Trained a SentencePiece unigram model of %d pieces on %d sentences: %s',
               tokenizer.vocab_size, len(sentences), tokenizer.vocab_file)
  return tokenizer
