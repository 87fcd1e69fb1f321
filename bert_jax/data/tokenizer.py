"""Tokenizers chosen by config.data.tokenizer: WordPiece (BERT's, here), byte-level BPE
(RoBERTa's, data/bpe.py), SentencePiece unigram (ALBERT's, data/spm.py) and SentencePiece with
fairseq's dictionary ids (XLM-R's, data/spm_fairseq.py); each trains a vocab on the corpus when
none is given, cached by a fingerprint of the corpus, the kind and its settings.

A tokenizer has `kind`, `lowercase`, `vocab_size`, `vocab_file` (what config.data.vocab_file
names to load it again), `special` (pretraining.SpecialIds: its special ids and pair layout),
`files()` (the files a directory keeps of it), `encode_sentences`, `encode_with_offsets`,
`encode_words`, `id_to_token`, `decode`, `is_continuation` and `vocab_hash`.
"""

import hashlib
import os
import shutil

from absl import logging
import numpy as np
import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import normalizers
from tokenizers import pre_tokenizers
from tokenizers import trainers

from bert_jax.data.pretraining import SpecialIds
from bert_jax.core import files

KINDS = ('wordpiece', 'bpe', 'sentencepiece', 'sentencepiece_fairseq')
# BERT's special tokens; a trained vocab lists them first, so [PAD] is id 0.
SPECIAL_TOKENS = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')
VOCAB_FILENAME = 'vocab.txt'
# What a directory (a workdir, a prepared corpus, the cache) keeps of a vocab of each kind; the
# first file is the one data.vocab_file names (BPE's merges.txt lies beside its vocab.json).
KEPT_FILES = {'wordpiece': (VOCAB_FILENAME,), 'bpe': ('vocab.json', 'merges.txt'),
              'sentencepiece': ('spiece.model',),
              'sentencepiece_fairseq': ('sentencepiece.bpe.model',)}
# Sentences per encode call: bounds the memory of Encoding objects on large corpora.
_ENCODE_CHUNK = 50_000


class WordPieceTokenizer:
  """BERT's tokenizer: BertNormalizer, BertPreTokenizer and WordPiece over a vocab.txt."""
  kind = 'wordpiece'

  def __init__(self, vocab_file: str, lowercase: bool):
    vocab_file = os.path.expanduser(vocab_file)
    if not os.path.isfile(vocab_file):
      raise FileNotFoundError(f'Vocab file {vocab_file!r} does not exist.')
    self._vocab_file = vocab_file
    try:
      self._tokens = _read_vocab(vocab_file)
    except UnicodeDecodeError as e:
      raise ValueError(f'Vocab file {vocab_file!r} is not UTF-8 text ({e.reason}): WordPiece '
                       'reads a vocab.txt of one token a line; a SentencePiece .model needs '
                       "config.data.tokenizer='sentencepiece'.") from e
    vocab = {token: index for index, token in enumerate(self._tokens)}
    if len(vocab) != len(self._tokens):
      raise ValueError(f'Vocab file {vocab_file!r} lists a token twice; ids would be ambiguous.')
    missing = [token for token in SPECIAL_TOKENS if token not in vocab]
    if missing:
      raise ValueError(f'Vocab file {vocab_file!r} lacks the special tokens {missing}; '
                       f'BERT needs all of {list(SPECIAL_TOKENS)} (a WordPiece vocab.txt lists '
                       "one token a line; a byte-level BPE vocab.json needs "
                       "config.data.tokenizer='bpe').")
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

  def files(self) -> dict[str, str]:
    """{name a directory keeps it under: path}."""
    return {VOCAB_FILENAME: self._vocab_file}

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


def load_tokenizer(kind: str, vocab_file: str, lowercase: bool):
  """The `kind` tokenizer of `vocab_file`: a vocab.txt (wordpiece), vocab.json with merges.txt
  beside it or their directory (bpe), a .model (sentencepiece); local or gs://."""
  vocab_file = _local_vocab(kind, vocab_file)
  if kind == 'wordpiece':
    return WordPieceTokenizer(vocab_file, lowercase)
  return _family(kind).load(vocab_file, lowercase)


def _local_vocab(kind: str, vocab_file: str) -> str:
  """A gs:// vocab copied to local disk with its kind's files beside it (tokenizers read local
  files only); a local one as it is."""
  if not files.is_url(vocab_file):
    return vocab_file
  names = KEPT_FILES.get(kind, ())
  if names and files.isdir(vocab_file):
    return os.path.dirname(files.local_copy(f'{vocab_file.rstrip("/")}/{names[0]}', names))
  return files.local_copy(vocab_file, names)


def train(kind: str, documents: list[list[str]], vocab_size: int, lowercase: bool,
          output_dir: str):
  """Trains a `kind` vocab on the sentences, writes it to output_dir (KEPT_FILES), loads it."""
  if kind == 'wordpiece':
    return train_tokenizer(documents, vocab_size, lowercase, output_dir)
  return _family(kind).train(documents, vocab_size, lowercase, output_dir)


def _family(kind: str):
  """The module of a kind other than WordPiece, imported only when chosen."""
  # pylint: disable=g-import-not-at-top
  if kind == 'bpe':
    from bert_jax.data import bpe
    return bpe
  if kind == 'sentencepiece':
    from bert_jax.data import spm
    return spm
  if kind == 'sentencepiece_fairseq':
    from bert_jax.data import spm_fairseq
    return spm_fairseq
  raise ValueError(f'config.data.tokenizer={kind!r} is not one of {", ".join(KINDS)}.')


def vocab_path(kind: str, directory: str) -> str:
  """Where `directory` keeps a `kind` vocab: the path load_tokenizer takes."""
  if kind not in KEPT_FILES:
    raise ValueError(f'config.data.tokenizer={kind!r} is not one of {", ".join(KINDS)}.')
  return os.path.join(os.path.expanduser(directory), KEPT_FILES[kind][0])


def kept_vocab(kind: str, directory: str) -> str:
  """vocab_path(kind, directory) when every file of it is there, else ''."""
  path = vocab_path(kind, directory)
  names = KEPT_FILES[kind]
  complete = all(files.isfile(os.path.join(os.path.dirname(path), name)) for name in names)
  return path if complete else ''


def keep(tokenizer, directory: str) -> None:
  """Copies the tokenizer's files into `directory` (each through a renamed temporary)."""
  directory = os.path.expanduser(directory)
  if files.is_url(directory):  # An upload replaces the object whole.
    for name, path in tokenizer.files().items():
      files.upload(path, f'{directory}/{name}')
    return
  os.makedirs(directory, exist_ok=True)
  for name, path in tokenizer.files().items():
    target = os.path.join(directory, name)
    if os.path.abspath(path) == os.path.abspath(target):
      continue
    temporary = f'{target}.{os.getpid()}.tmp'
    try:
      shutil.copyfile(path, temporary)
      os.replace(temporary, target)
    except BaseException:
      if os.path.exists(temporary):
        os.unlink(temporary)
      raise


def load_or_train_tokenizer(vocab_file: str, documents: list[list[str]], vocab_size: int,
                            lowercase: bool, workdir: str, cache_dir: str = '',
                            kind: str = 'wordpiece'):
  """Loads `vocab_file`, else the workdir's vocab, else a cached or newly trained one.

  HF's WordPiece trainer is not deterministic (its tie-breaking follows hash-map order), so a
  vocab trained for a corpus is cached under `cache_dir` by a fingerprint of (corpus, kind, size,
  casing, training settings): every run on the same corpus, an ablation arm or a rerun, gets the
  identical vocab.
  """
  if vocab_file:
    return load_tokenizer(kind, vocab_file, lowercase)
  if not workdir:
    raise ValueError('Give a vocab_file or a workdir to train and cache a vocab in.')
  cached = kept_vocab(kind, workdir)
  if cached:
    # A resumed run must see the ids its checkpoint was trained with, so never retrain.
    logging.info('Loading the vocab cached in the workdir: %s', cached)
    return load_tokenizer(kind, cached, lowercase)
  if not cache_dir:
    return train(kind, documents, vocab_size, lowercase, workdir)
  shared_dir = os.path.join(os.path.expanduser(cache_dir),
                            corpus_fingerprint(documents, vocab_size, lowercase, kind))
  shared = kept_vocab(kind, shared_dir)
  if shared:
    logging.info('Using the vocab trained earlier for this corpus: %s', shared)
    tokenizer = load_tokenizer(kind, shared, lowercase)
  else:
    tokenizer = train(kind, documents, vocab_size, lowercase, shared_dir)
  keep(tokenizer, workdir)
  return load_tokenizer(kind, vocab_path(kind, workdir), lowercase)


def corpus_fingerprint(documents: list[list[str]], vocab_size: int, lowercase: bool,
                       kind: str = 'wordpiece') -> str:
  """sha256 of the sentences and the tokenizer settings: names a trained vocab."""
  settings = '' if kind == 'wordpiece' else f':{_family(kind).TRAINING_SETTINGS}'
  digest = hashlib.sha256(f'{kind}:{vocab_size}:{lowercase}{settings}\n'.encode())
  for document in documents:
    for sentence in document:
      digest.update(sentence.encode('utf-8', 'replace') + b'\n')
    digest.update(b'\n')
  return digest.hexdigest()[:32]


def encode_documents(tokenizer, documents: list[list[str]]) -> list[list[np.ndarray]]:
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
