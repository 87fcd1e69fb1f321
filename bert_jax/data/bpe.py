"""Byte-level BPE (RoBERTa's, GPT-2's) through HF `tokenizers`: a vocab.json and a merges.txt.

The semantics of `tokenizers.ByteLevelBPETokenizer` and transformers' RobertaTokenizerFast: the
ByteLevel pre-tokenizer without a prefix space (a text's first word has no 'Ġ'), BPE over the
byte alphabet (no unknown token is ever needed), cased unless config.data.lowercase. Rows are
laid out as RoBERTa's: `<s> A </s>` and `<s> A </s></s> B </s>`.
"""

import hashlib
import json
import os
import shutil
import tempfile

from absl import logging
import numpy as np
import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import normalizers
from tokenizers import pre_tokenizers
from tokenizers import processors

from bert_jax.data.pretraining import SpecialIds

VOCAB_NAME, MERGES_NAME = 'vocab.json', 'merges.txt'
# RoBERTa's special tokens, in the order a trained vocab lists them (RoBERTa's own has <mask>
# last); found by name in a given vocab.
SPECIAL_TOKENS = ('<s>', '<pad>', '</s>', '<unk>', '<mask>')
_MIN_FREQUENCY = 2
# What the trained vocab depends on besides the corpus, its size and casing: the cache key.
TRAINING_SETTINGS = f'byte-level,min_frequency={_MIN_FREQUENCY},specials={",".join(SPECIAL_TOKENS)}'
_ENCODE_CHUNK = 50_000
_WORD_START = 'Ġ'  # The byte-level spelling of a space: a piece that begins a word.


def vocab_files(vocab_file: str) -> tuple[str, str]:
  """config.data.vocab_file -> (vocab.json, merges.txt): a directory holding both, or a .json
  vocab with merges.txt beside it."""
  path = os.path.expanduser(vocab_file)
  if os.path.isdir(path):
    vocab, merges = os.path.join(path, VOCAB_NAME), os.path.join(path, MERGES_NAME)
  elif path.endswith('.json'):
    vocab, merges = path, os.path.join(os.path.dirname(path), MERGES_NAME)
  else:
    raise ValueError(
        f'{vocab_file!r} is neither a directory nor a .json file: byte-level BPE reads a '
        f'{VOCAB_NAME} and a {MERGES_NAME}; give their directory or the {VOCAB_NAME} path with '
        f'{MERGES_NAME} beside it.')
  missing = [name for name in (vocab, merges) if not os.path.isfile(name)]
  if missing:
    raise FileNotFoundError(
        f'{vocab_file!r}: {" and ".join(missing)} not found; byte-level BPE reads a {VOCAB_NAME} '
        f'and a {MERGES_NAME}: give their directory or the {VOCAB_NAME} path with {MERGES_NAME} '
        'beside it.')
  return vocab, merges


class ByteLevelBpeTokenizer:
  """RoBERTa's tokenizer over a vocab.json and merges.txt."""
  kind = 'bpe'

  def __init__(self, vocab_file: str, lowercase: bool):
    self._vocab_file, self._merges_file = vocab_files(vocab_file)
    try:
      with open(self._vocab_file, encoding='utf-8') as f:
        vocab = json.load(f)
    except ValueError as e:
      raise ValueError(f'{self._vocab_file!r} is not a JSON vocab ({e}).') from e
    if not isinstance(vocab, dict) or sorted(vocab.values()) != list(range(len(vocab))):
      raise ValueError(f'{self._vocab_file!r} is not a BPE vocab: a JSON object of tokens to '
                       'the ids 0, 1, ... each once.')
    self._tokens = sorted(vocab, key=vocab.get)
    missing = [token for token in SPECIAL_TOKENS if token not in vocab]
    if missing:
      raise ValueError(f'{self._vocab_file!r} lacks the special tokens {missing}; RoBERTa needs '
                       f'all of {list(SPECIAL_TOKENS)}.')
    if not lowercase and not any(len(token) > 1 and any('A' <= c <= 'Z' for c in token)
                                 for token in self._tokens):
      raise ValueError(
          f'{self._vocab_file!r} holds no token with a capital letter beyond single bytes: it '
          'was trained on lowercased text, and config.data.lowercase=False would spell every '
          'capitalised word byte by byte; set config.data.lowercase=True.')
    self._special = SpecialIds(pad=vocab['<pad>'], unk=vocab['<unk>'], cls=vocab['<s>'],
                               sep=vocab['</s>'], mask=vocab['<mask>'], separators=2,
                               draws_specials=False, segment_b=False)
    self._tokenizer = _byte_level(self._vocab_file, self._merges_file, lowercase, False)
    # Pre-split words (NER) each begin a word, as RobertaTokenizerFast(add_prefix_space=True).
    self._word_tokenizer = _byte_level(self._vocab_file, self._merges_file, lowercase, True)
    self.lowercase = lowercase

  @property
  def vocab_size(self) -> int:
    return len(self._tokens)

  @property
  def vocab_file(self) -> str:
    """The vocab.json; merges.txt lies beside it."""
    return self._vocab_file

  @property
  def special(self) -> SpecialIds:
    """Ids of <pad>, <unk>, <s> (cls), </s> (sep) and <mask>; RoBERTa's pair layout."""
    return self._special

  def files(self) -> dict[str, str]:
    return {VOCAB_NAME: self._vocab_file, MERGES_NAME: self._merges_file}

  def encode_sentences(self, sentences: list[str]) -> list[np.ndarray]:
    """Returns int32 ids per sentence, without special tokens."""
    ids = []
    for start in range(0, len(sentences), _ENCODE_CHUNK):
      encodings = self._tokenizer.encode_batch_fast(sentences[start:start + _ENCODE_CHUNK],
                                                    add_special_tokens=False)
      ids += [np.asarray(encoding.ids, dtype=np.int32) for encoding in encodings]
    return ids

  def encode_with_offsets(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per text: (int32 ids [n], int32 character spans [n, 2] into the text), a piece's leading
    space left out of its span."""
    out = []
    for start in range(0, len(texts), _ENCODE_CHUNK):
      for encoding in self._tokenizer.encode_batch(texts[start:start + _ENCODE_CHUNK],
                                                   add_special_tokens=False):
        offsets = np.asarray(encoding.offsets, dtype=np.int32).reshape(-1, 2)
        out.append((np.asarray(encoding.ids, dtype=np.int32), offsets))
    return out

  def encode_words(self, sentences: list[list[str]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per pre-split sentence: (int32 ids [n], int32 index of the word each piece belongs to
    [n]); every word is encoded as if a space preceded it."""
    out = []
    for start in range(0, len(sentences), _ENCODE_CHUNK):
      for encoding in self._word_tokenizer.encode_batch(sentences[start:start + _ENCODE_CHUNK],
                                                        is_pretokenized=True,
                                                        add_special_tokens=False):
        words = np.asarray([-1 if w is None else w for w in encoding.word_ids], dtype=np.int32)
        out.append((np.asarray(encoding.ids, dtype=np.int32), words))
    return out

  def id_to_token(self, index: int) -> str:
    return self._tokens[index]

  def decode(self, ids) -> str:
    """The text of `ids`; special tokens are shown as such."""
    return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

  def is_continuation(self) -> np.ndarray:
    """A bool per id: True for pieces that do not begin a word (no 'Ġ'), as fairseq's whole-word
    masking tells them."""
    special = set(self._special.ids().tolist())
    return np.array([not token.startswith(_WORD_START) and index not in special
                     for index, token in enumerate(self._tokens)], dtype=bool)

  def tokenizer_json(self) -> str:
    """transformers' tokenizer.json of this tokenizer: the same pipeline (lowercasing included),
    RoBERTa's `<s> A </s></s> B </s>` post-processor and its special tokens, <mask> taking the
    spaces before it (RobertaTokenizer's lstrip)."""
    tokenizer = tokenizers.Tokenizer.from_str(self._tokenizer.to_str())
    tokenizer.post_processor = processors.RobertaProcessing(
        ('</s>', self._special.sep), ('<s>', self._special.cls), trim_offsets=True,
        add_prefix_space=False)
    tokenizer.add_special_tokens([
        tokenizers.AddedToken(token, lstrip=token == '<mask>', normalized=False, special=True)
        for token in SPECIAL_TOKENS])
    return tokenizer.to_str()

  def vocab_hash(self) -> str:
    """sha256 (hex) of vocab.json and merges.txt together."""
    digest = hashlib.sha256()
    for name, path in self.files().items():
      with open(path, 'rb') as f:
        data = f.read()
      digest.update(f'{name}:{len(data)}\n'.encode() + data)
    return digest.hexdigest()


def _byte_level(vocab_file: str, merges_file: str, lowercase: bool,
                add_prefix_space: bool) -> tokenizers.Tokenizer:
  """ByteLevelBPETokenizer's pipeline; offsets trimmed of the spaces pieces carry."""
  tokenizer = tokenizers.Tokenizer(models.BPE.from_file(vocab_file, merges_file))
  if lowercase:
    tokenizer.normalizer = normalizers.Lowercase()
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
  tokenizer.decoder = decoders.ByteLevel()
  tokenizer.post_processor = processors.ByteLevel(trim_offsets=True)
  return tokenizer


def load(vocab_file: str, lowercase: bool) -> ByteLevelBpeTokenizer:
  return ByteLevelBpeTokenizer(vocab_file, lowercase)


def train(documents: list[list[str]], vocab_size: int, lowercase: bool,
          output_dir: str) -> ByteLevelBpeTokenizer:
  """Trains a byte-level BPE vocab on the sentences, writes output_dir/{vocab.json, merges.txt},
  loads it."""
  sentences = [sentence for document in documents for sentence in document]
  if not sentences:
    raise ValueError('Cannot train a tokenizer on a corpus without sentences.')
  if vocab_size <= 256 + len(SPECIAL_TOKENS):
    raise ValueError(f'vocab_size={vocab_size} must exceed the 256 bytes and the '
                     f'{len(SPECIAL_TOKENS)} special tokens of a byte-level BPE vocab.')
  trainer = tokenizers.ByteLevelBPETokenizer(lowercase=lowercase)
  trainer.train_from_iterator(sentences, vocab_size=vocab_size, min_frequency=_MIN_FREQUENCY,
                              special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                              length=len(sentences))
  output_dir = os.path.expanduser(output_dir)
  os.makedirs(output_dir, exist_ok=True)
  # Both files are written aside and renamed in, vocab.json last: a reader that sees it sees a
  # complete pair.
  staging = tempfile.mkdtemp(prefix='.bpe-', dir=output_dir)
  try:
    trainer.save_model(staging)
    for name in (MERGES_NAME, VOCAB_NAME):
      os.replace(os.path.join(staging, name), os.path.join(output_dir, name))
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  tokenizer = ByteLevelBpeTokenizer(output_dir, lowercase)
  logging.info('Trained a byte-level BPE vocab of %d tokens on %d sentences: %s',
               tokenizer.vocab_size, len(sentences), tokenizer.vocab_file)
  return tokenizer
