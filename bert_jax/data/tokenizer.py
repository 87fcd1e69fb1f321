"""WordPiece tokenization (BERT's), through Hugging Face `tokenizers`."""

import hashlib
import os

from absl import logging
import numpy as np
import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import normalizers
from tokenizers import pre_tokenizers
from tokenizers import trainers

from bert_jax.data.pretraining import SpecialIds

# BERT's special tokens; a trained vocab lists them first, so [PAD] is id 0.
SPECIAL_TOKENS = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')
VOCAB_FILENAME = 'vocab.txt'
# Sentences per encode call: bounds the memory of Encoding objects on large corpora.
_ENCODE_CHUNK = 50_000


class WordPieceTokenizer:
  """BERT's tokenizer: BertNormalizer, BertPreTokenizer and WordPiece over a vocab.txt."""

  def __init__(self, vocab_file: str, lowercase: bool):
    vocab_file = os.path.expanduser(vocab_file)
    if not os.path.isfile(vocab_file):
      raise FileNotFoundError(f'Vocab file {vocab_file!r} does not exist.')
    self._vocab_file = vocab_file
    self._tokens = _read_vocab(vocab_file)
    vocab = {token: index for index, token in enumerate(self._tokens)}
    if len(vocab) != len(self._tokens):
      raise ValueError(f'Vocab file {vocab_file!r} lists a token twice; ids would be ambiguous.')
    missing = [token for token in SPECIAL_TOKENS if token not in vocab]
    if missing:
      raise ValueError(f'Vocab file {vocab_file!r} lacks the special tokens {missing}; '
                       f'BERT needs all of {list(SPECIAL_TOKENS)}.')
    self._special = SpecialIds(*(vocab[token] for token in SPECIAL_TOKENS))
    self._tokenizer = _bert_tokenizer(models.WordPiece(vocab, unk_token='[UNK]'), lowercase)
    self.lowercase = lowercase

  @property
  def vocab_size(self) -> int:
    """Number of entries in the vocab."""
    return len(self._tokens)

  @property
  def vocab_file(self) -> str:
    """Path of the vocab.txt this tokenizer reads."""
    return self._vocab_file

  @property
  def special(self) -> SpecialIds:
    """Ids of [PAD], [UNK], [CLS], [SEP] and [MASK]."""
    return self._special

  def encode_sentences(self, sentences: list[str]) -> list[np.ndarray]:
    """Returns int32 WordPiece ids per sentence, without special tokens."""
    ids = []
    for start in range(0, len(sentences), _ENCODE_CHUNK):
      encodings = self._tokenizer.encode_batch_fast(
          sentences[start:start + _ENCODE_CHUNK], add_special_tokens=False)
      ids += [np.asarray(encoding.ids, dtype=np.int32) for encoding in encodings]
    return ids

  def encode_with_offsets(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per text: (int32 ids [n], int32 character spans [n, 2] into the original text).

    The spans are of the unnormalised text (lowercasing and accent stripping are tracked), so
    text[start:end] is the original spelling of each piece; '##' pieces span their part of a word.
    """
    out = []
    for start in range(0, len(texts), _ENCODE_CHUNK):
      for encoding in self._tokenizer.encode_batch(texts[start:start + _ENCODE_CHUNK],
                                                   add_special_tokens=False):
        offsets = np.asarray(encoding.offsets, dtype=np.int32).reshape(-1, 2)
        out.append((np.asarray(encoding.ids, dtype=np.int32), offsets))
    return out

  def encode_words(self, sentences: list[list[str]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per pre-split sentence: (int32 ids [n], int32 index of the word each piece belongs to [n]).

    A word that normalises to nothing (e.g. a control character) gets no pieces.
    """
    out = []
    for start in range(0, len(sentences), _ENCODE_CHUNK):
      for encoding in self._tokenizer.encode_batch(sentences[start:start + _ENCODE_CHUNK],
                                                   is_pretokenized=True,
                                                   add_special_tokens=False):
        words = np.asarray([-1 if w is None else w for w in encoding.word_ids], dtype=np.int32)
        out.append((np.asarray(encoding.ids, dtype=np.int32), words))
    return out

  def id_to_token(self, index: int) -> str:
    """The vocab entry of `index`."""
    return self._tokens[index]

  def decode(self, ids) -> str:
    """Returns the text of `ids`, '##' pieces joined; special tokens are shown as such."""
    return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

  def is_continuation(self) -> np.ndarray:
    """Returns a bool per vocab id: True for '##' pieces that continue a word."""
    return np.array([token.startswith('##') for token in self._tokens], dtype=bool)

  def vocab_hash(self) -> str:
    """Returns the sha256 (hex) of the vocab file, to tie caches and checkpoints to it."""
    with open(self._vocab_file, 'rb') as f:
      return hashlib.sha256(f.read()).hexdigest()


def _read_vocab(vocab_file):
  """Returns the tokens of a vocab.txt, one per line; the line number is the id."""
  with open(vocab_file, encoding='utf-8') as f:
    return [line.rstrip('\r\n') for line in f]


def _bert_tokenizer(model, lowercase):
  """Wraps a WordPiece model in BERT's normalizer, pre-tokenizer and decoder."""
  tokenizer = tokenizers.Tokenizer(model)
  # Uncased BERT also strips accents; the cased model keeps both.
  tokenizer.normalizer = normalizers.BertNormalizer(
      clean_text=True, handle_chinese_chars=True, strip_accents=lowercase,
      lowercase=lowercase)
  tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tokenizer.decoder = decoders.WordPiece(prefix='##')
  return tokenizer


def train_tokenizer(documents: list[list[str]], vocab_size: int, lowercase: bool,
                    output_dir: str) -> WordPieceTokenizer:
  """Trains a WordPiece vocab on the sentences, writes output_dir/vocab.txt, loads it."""
  if vocab_size <= len(SPECIAL_TOKENS):
    raise ValueError(f'vocab_size={vocab_size} must exceed the {len(SPECIAL_TOKENS)} '
                     'special tokens.')
  tokenizer = _bert_tokenizer(models.WordPiece(unk_token='[UNK]'), lowercase)
  trainer = trainers.WordPieceTrainer(
      vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
      continuing_subword_prefix='##', show_progress=False)
  sentences = [sentence for document in documents for sentence in document]
  if not sentences:
    raise ValueError('Cannot train a tokenizer on a corpus without sentences.')
  tokenizer.train_from_iterator(sentences, trainer=trainer, length=len(sentences))
  vocab = tokenizer.get_vocab()
  tokens = sorted(vocab, key=vocab.get)
  vocab_file = os.path.join(os.path.expanduser(output_dir), VOCAB_FILENAME)
  _write_lines(tokens, vocab_file)
  logging.info('Trained a WordPiece vocab of %d tokens on %d sentences: %s',
               len(tokens), len(sentences), vocab_file)
  return WordPieceTokenizer(vocab_file, lowercase)


def _write_lines(lines, path):
  """Writes one line each, through a renamed temporary so readers never see half a file."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  temporary = f'{path}.{os.getpid()}.tmp'
  try:
    with open(temporary, 'w', encoding='utf-8') as f:
      f.writelines(line + '\n' for line in lines)
    os.replace(temporary, path)
  except BaseException:
    if os.path.exists(temporary):
      os.unlink(temporary)
    raise


def load_or_train_tokenizer(vocab_file: str, documents: list[list[str]], vocab_size: int,
                            lowercase: bool, workdir: str,
                            cache_dir: str = '') -> WordPieceTokenizer:
  """Loads `vocab_file`, else the workdir's vocab, else a cached or newly trained one.

  HF's WordPiece trainer is not deterministic (its tie-breaking follows hash-map order), so a
  vocab trained for a corpus is cached under `cache_dir` by a fingerprint of (corpus, size,
  casing): every run on the same corpus, an ablation arm or a rerun, gets the identical vocab.
  """
  if vocab_file:
    return WordPieceTokenizer(vocab_file, lowercase)
  if not workdir:
    raise ValueError('Give a vocab_file or a workdir to train and cache a vocab in.')
  cached = os.path.join(os.path.expanduser(workdir), VOCAB_FILENAME)
  if os.path.isfile(cached):
    # A resumed run must see the ids its checkpoint was trained with, so never retrain.
    logging.info('Loading the vocab cached in the workdir: %s', cached)
    return WordPieceTokenizer(cached, lowercase)
  if not cache_dir:
    return train_tokenizer(documents, vocab_size, lowercase, workdir)
  shared_dir = os.path.join(os.path.expanduser(cache_dir),
                            corpus_fingerprint(documents, vocab_size, lowercase))
  shared = os.path.join(shared_dir, VOCAB_FILENAME)
  if os.path.isfile(shared):
    logging.info('Using the vocab trained earlier for this corpus: %s', shared)
  else:
    train_tokenizer(documents, vocab_size, lowercase, shared_dir)
  with open(shared, encoding='utf-8') as f:
    _write_lines(f.read().splitlines(), cached)
  return WordPieceTokenizer(cached, lowercase)


def corpus_fingerprint(documents: list[list[str]], vocab_size: int, lowercase: bool) -> str:
  """sha256 of the sentences and the tokenizer settings: names a trained vocab."""
  digest = hashlib.sha256(f'wordpiece:{vocab_size}:{lowercase}\n'.encode())
  for document in documents:
    for sentence in document:
      digest.update(sentence.encode('utf-8', 'replace') + b'\n')
    digest.update(b'\n')
  return digest.hexdigest()[:32]


def encode_documents(tokenizer: WordPieceTokenizer,
                     documents: list[list[str]]) -> list[list[np.ndarray]]:
  """Encodes every sentence in one batched call; empty sentences and documents are dropped."""
  sentences = [sentence for document in documents for sentence in document if sentence.strip()]
  ids = iter(tokenizer.encode_sentences(sentences))
  encoded = []
  for document in documents:
    pieces = [next(ids) for sentence in document if sentence.strip()]
    pieces = [piece for piece in pieces if piece.size]
    if pieces:
      encoded.append(pieces)
  return encoded
