"""Cross-lingual pretraining rows (XLM, XLM-R): MLM over many languages, translation-LM pairs.

Pure numpy functions of (tokens, rng, settings) beside data/pretraining.py's, read in memory by
data/pipeline.py's stream (build_examples is its `build`). A corpus holds each language's
documents (data.corpus with '{lang}') and parallel sentence pairs (data.parallel); one vocab,
trained on all of it, is shared by every language. At scale the MLM rows stream from a prepared
corpus a language instead (data/prepare.py's prepare_languages, data/streaming.py's
LanguageDocuments and SourceOrder); translation pairs are read in memory only.
- MLM rows: each language's documents make the rows a monolingual run makes (data.rows: segments
  or FULL-SENTENCES), never across languages; every token carries its language's id. With
  data.language_alpha < 1 each language's rows are resampled to q_i = p_i^alpha / sum_j p_j^alpha
  of the pass (p_i: its share of the rows), the smoothing XLM (0.5) and XLM-R (0.3) sample
  languages with, so that small languages are seen more often. Under XLM's causal LM
  (objectives='clm') the same rows come unmasked.
- Translation-LM rows (translation_features, XLM's TLM): a sentence and its translation in one
  row, laid out as the tokenizer lays out a pair (`[CLS] A [SEP] B [SEP]`, `<s> A </s></s> B
  </s>`), positions restarting at the second sentence's part and each part carrying its
  language's id; each sentence is masked on its own (masking.mask_parts), so both have
  predictions and the model may read a masked word's translation.
Every row carries position_ids and language_ids [S] beside BERT's keys; the rows of a pass are
shuffled together.
"""

import dataclasses
import re

import numpy as np

from bert_jax import objectives
from bert_jax.core.errors import ConfigError
from bert_jax.data import corpus as corpus_lib
from bert_jax.data import masking
from bert_jax.data import pipeline
from bert_jax.data import pretraining

# A language code: letters, digits, '_' ('-' joins the two of a data.parallel pair).
_CODE = re.compile(r'[A-Za-z0-9_]+')
# data.corpus's stand-in for a language's code.
LANGUAGE_FIELD = '{lang}'


@dataclasses.dataclass(frozen=True)
class Corpus:
  """A cross-lingual corpus, as text (sentences are str) or token ids (int32 arrays)."""
  # [languages]: each language's documents (lists of sentences), by language id.
  documents: tuple
  # ((source id, target id, [(sentence, its translation), ...]), ...): data.parallel's items.
  parallel: tuple = ()

  def __len__(self) -> int:
    """Documents and sentence pairs."""
    return sum(map(len, self.documents)) + sum(len(pairs) for _, _, pairs in self.parallel)


def parse_languages(text: str) -> tuple[str, ...]:
  """'en,fr' -> ('en', 'fr'); ValueError for a malformed or repeated code."""
  codes = tuple(code.strip() for code in str(text).split(',') if code.strip())
  for code in codes:
    if not _CODE.fullmatch(code):
      raise ValueError(f'config.data.languages={text!r}: {code!r} is not a language code; codes '
                       "are letters, digits and '_', comma separated (e.g. 'en,fr,zh_Hans').")
  repeated = sorted({code for code in codes if codes.count(code) > 1})
  if repeated:
    raise ValueError(f'config.data.languages={text!r} names {", ".join(repeated)} more than once; '
                     'each language has one id (its index).')
  return codes


def parse_parallel(text: str, languages: tuple[str, ...]) -> list[tuple[int, int, str]]:
  """'en-fr:a.tsv,de-en:b.tsv' -> [(0, 1, 'a.tsv'), ...]: (source id, target id, files) per item;
  ValueError naming a malformed item or an unknown language."""
  items = []
  for item in (part.strip() for part in str(text).split(',') if part.strip()):
    pair, sep, files = item.partition(':')
    codes = pair.split('-')
    if not sep or not files.strip() or len(codes) != 2:
      raise ValueError(f'config.data.parallel={text!r}: {item!r} is not SRC-TGT:FILES (e.g. '
                       "'en-fr:para.en-fr.tsv', a sentence and its translation per line, "
                       'tab separated).')
    unknown = [code for code in codes if code not in languages]
    if unknown:
      raise ValueError(f'config.data.parallel={text!r}: {item!r} names {", ".join(unknown)}, '
                       f'not among config.data.languages ({", ".join(languages) or "none"}).')
    if codes[0] == codes[1]:
      raise ValueError(f'config.data.parallel={text!r}: {item!r} pairs {codes[0]} with itself; '
                       'a translation pair has two languages.')
    items.append((languages.index(codes[0]), languages.index(codes[1]), files.strip()))
  return items


def check_config(config) -> None:
  """The cross-lingual data keys fit each other, config.model.num_languages and the run:
  ConfigError naming the value and what is valid, before anything is read or built."""
  data, count = config.data, config.model.get('num_languages', 0)
  try:
    languages = parse_languages(data.get('languages', ''))
    if not languages:
      if data.get('parallel', ''):
        raise ValueError(f'config.data.parallel={data.parallel!r} needs config.data.languages '
                         "(the languages its pairs name, e.g. 'en,fr'); without it set "
                         "parallel=''.")
      if count:
        raise ValueError(f'config.model.num_languages={count} needs language ids: set '
                         f'config.data.languages to the corpus\'s {count} languages '
                         "(e.g. 'en,fr'), or num_languages=0 (XLM-R: none).")
      return
    parallel = parse_parallel(data.parallel, languages)
  except ValueError as e:
    raise ConfigError(str(e)) from e
  problems = []
  if count and count != len(languages):
    problems.append(f'model.num_languages={count} but data.languages names {len(languages)} '
                    f'({", ".join(languages)}); language ids index the table: set '
                    f'num_languages={len(languages)} (or 0: no language embeddings)')
  if data.prepared and parallel:
    problems.append(f'data.parallel={data.parallel!r} with data.prepared={data.prepared!r}: '
                    'translation pairs are read in memory; set parallel=\'\' to stream the '
                    "prepared languages' MLM rows, or prepared='' to read both in memory")
  if data.prepared and data.packing:
    problems.append(f'data.packing=True with data.prepared={data.prepared!r}: a streamed '
                    'cross-lingual row is one instance of one language; set packing=False')
  names = objectives.parse(config.objectives)
  if names not in (('mlm',), ('clm',)):
    problems.append(f"objectives={config.objectives!r}: cross-lingual rows train 'mlm' (MLM and "
                    "TLM rows) or 'clm' (XLM's causal LM, with model.causal=True); set "
                    "config.objectives='mlm'")
  if names == ('clm',) and parallel:
    problems.append(f"objectives='clm' with parallel={data.parallel!r}: translation rows are "
                    "masked LM's (TLM); set parallel='' for XLM's causal LM, or objectives='mlm'")
  if data.corpus and LANGUAGE_FIELD not in data.corpus and not data.prepared:
    problems.append(f'corpus={data.corpus!r} has no {LANGUAGE_FIELD!r}: with data.languages it '
                    "names each language's files, e.g. 'wiki.{lang}.txt'")
  if not data.corpus and not parallel and not data.prepared:
    problems.append("corpus='' and parallel='': give monolingual text (data.corpus with "
                    "'{lang}'), parallel text (data.parallel) or both")
  # [CLS] a [SEP] [SEP] b [SEP]: a translation pair needs a token of each sentence.
  if parallel and data.max_seq_length < 6:
    problems.append(f'max_seq_length={data.max_seq_length} leaves a translation pair no room '
                    'for both sentences; use at least 6')
  if problems:
    raise ConfigError('config.data.languages='
                                 f'{data.languages!r}: ' + '; '.join(problems) + '.')


def read_parallel(files: str) -> list[tuple[str, str]]:
  """The sentence pairs of `files` (comma-free globs; .xz/.gz ok): one per line, the sentence and
  its translation separated by a tab, whitespace normalised; a pair with an empty side is
  dropped. ValueError naming the file and line of a line without exactly one tab."""
  pairs = []
  for path in corpus_lib.corpus_files(files):
    with corpus_lib.open_text(path) as f:
      for number, line in enumerate(f, 1):
        if not line.strip():
          continue
        sides = line.rstrip('\n').split('\t')
        if len(sides) != 2:
          raise ValueError(f'{path}:{number} has {len(sides) - 1} tabs; a parallel file holds a '
                           'sentence and its translation per line, separated by one tab.')
        source, target = (' '.join(side.split()) for side in sides)
        if source and target:
          pairs.append((source, target))
  return pairs


def read_corpus(config) -> Corpus:
  """config.data's cross-lingual corpus, as text: data.corpus with each language's code in place
  of '{lang}', and data.parallel's pairs."""
  data = config.data
  languages = parse_languages(data.languages)
  documents = tuple(
      corpus_lib.read_corpus(data.corpus.replace(LANGUAGE_FIELD, code), data.corpus_format,
                             data.max_documents) if data.corpus else []
      for code in languages)
  parallel = tuple((source, target, read_parallel(files))
                   for source, target, files in parse_parallel(data.parallel, languages))
  return Corpus(documents, parallel)


def text_documents(corpus: Corpus) -> list[list[str]]:
  """Every document and sentence pair of a text corpus, as the documents a shared vocab is
  trained on."""
  pairs = [list(pair) for _, _, items in corpus.parallel for pair in items]
  return [document for documents in corpus.documents for document in documents] + pairs


def encode(tokenizer, corpus: Corpus) -> Corpus:
  """A text corpus -> token ids; empty sentences and documents, and pairs with an empty side,
  are dropped."""
  from bert_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  documents = tuple(tokenizer_lib.encode_documents(tokenizer, docs) if docs else []
                    for docs in corpus.documents)
  parallel = []
  for source, target, pairs in corpus.parallel:
    ids = tokenizer.encode_sentences([side for pair in pairs for side in pair]) if pairs else []
    parallel.append((source, target, [(a, b) for a, b in zip(ids[::2], ids[1::2])
                                      if a.size and b.size]))
  return Corpus(documents, tuple(parallel))


def split(corpus: Corpus, eval_fraction: float, seed: int) -> tuple[Corpus, Corpus]:
  """(train, held out): each language's documents and each item's sentence pairs split as
  pipeline.split_documents splits a monolingual corpus."""
  documents = [pipeline.split_documents(docs, eval_fraction, seed) for docs in corpus.documents]
  parallel = [(source, target, pipeline.split_documents(pairs, eval_fraction, seed))
              for source, target, pairs in corpus.parallel]
  train = Corpus(tuple(d[0] for d in documents),
                 tuple((s, t, pairs[0]) for s, t, pairs in parallel))
  held_out = Corpus(tuple(d[1] for d in documents),
                    tuple((s, t, pairs[1]) for s, t, pairs in parallel))
  return train, held_out


def describe(corpus: Corpus, languages: tuple[str, ...]) -> str:
  """'en 10 documents, fr 8 documents, en-fr 120 pairs': a corpus's size by language."""
  parts = [f'{code} {len(docs)} documents' for code, docs in zip(languages, corpus.documents)]
  parts += [f'{languages[s]}-{languages[t]} {len(pairs)} pairs' for s, t, pairs in corpus.parallel]
  return ', '.join(parts)


def language_shares(counts, alpha: float) -> np.ndarray:
  """Each language's share of the rows sampled with smoothing `alpha`: p_i^alpha normalised,
  p_i = counts_i / sum(counts) (alpha 1: the corpus's own shares)."""
  q = (np.asarray(counts, np.float64) / max(sum(counts), 1)) ** alpha
  return q / q.sum()


def resample(instances: list[list], rng: np.random.Generator, alpha: float) -> list[list]:
  """Each language's instances (shuffled) cut or repeated to its language_shares of the total:
  a language over its share keeps its first rows, one under it gets all its rows and then rows
  drawn again at random."""
  counts = [len(rows) for rows in instances]
  if alpha == 1.0 or not sum(counts):
    return instances
  wanted = np.round(language_shares(counts, alpha) * sum(counts)).astype(np.int64)
  out = []
  for rows, count in zip(instances, wanted.tolist()):
    extra = rng.integers(len(rows), size=max(count - len(rows), 0)) if rows else []
    out.append(rows[:count] + [rows[k] for k in extra])
  return out


def translation_features(tokens_a, tokens_b, languages: tuple[int, int], rng: np.random.Generator,
                         settings: pretraining.MaskingSettings) -> dict | None:
  """One translation-LM row of a sentence (ids [len_a]) and its translation ([len_b]) of
  `languages` (their ids): the pair truncated as BERT's pairs to fit, laid out as the tokenizer
  lays out a pair, position ids restarting at 0 where the second sentence's part begins (its
  separator with RoBERTa's layout, else its first token), language ids of each part's language,
  each sentence masked on its own. None when truncation leaves a sentence empty."""
  s = settings
  tokens_a, tokens_b = pretraining.truncate_seq_pair(
      tokens_a, tokens_b, s.max_seq_length - s.special.overhead(pair=True), rng)
  if not len(tokens_a) or not len(tokens_b):
    return None
  input_ids, segment_ids = pretraining.assemble(
      pretraining.Instance(tokens_a, tokens_b, False), s.special)
  first = len(tokens_a) + 2  # [CLS] A [SEP]
  second = len(input_ids) - first
  masked_ids, positions, labels = masking.mask_parts(
      input_ids, [first], rng, max_predictions=s.max_predictions, special=s.special,
      vocab_size=s.vocab_size, mask_rate=s.mask_rate, mask_token_fraction=s.mask_token_fraction,
      random_token_fraction=s.random_token_fraction, keep_fraction=s.keep_fraction,
      is_continuation=s.is_continuation, max_ngram=s.max_ngram, spans=s.spans, span_p=s.span_p,
      max_span=s.max_span)
  return pretraining.padded_features(
      masked_ids, segment_ids, positions, labels, special=s.special,
      max_seq_length=s.max_seq_length, max_predictions=s.max_predictions,
      span_keys=s.span_keys,
      position_ids=np.concatenate([np.arange(first), np.arange(second)]),  # [n]
      language_ids=np.repeat(np.asarray(languages, np.int32), [first, second]))  # [n]


def monolingual_features(instance, language: int, rng: np.random.Generator,
                         settings: pretraining.MaskingSettings) -> dict:
  """An MLM row of one language: pipeline.make_features' row with position ids from 0 and the
  language's id on every token (padding: 0)."""
  features = pipeline.make_features(instance, rng, settings)
  length = int(features['input_mask'].sum())
  features['position_ids'] = np.where(np.arange(settings.max_seq_length) < length,
                                      np.arange(settings.max_seq_length), 0).astype(np.int32)
  features['language_ids'] = (features['input_mask'] * language).astype(np.int32)
  return features


def build_examples(corpus: Corpus, rng: np.random.Generator, settings: pretraining.MaskingSettings,
                   alpha: float = 1.0):
  """One pass over a corpus of ids: every language's MLM rows (resampled with `alpha`) and every
  translation pair's TLM row, masked, shuffled together, stacked; None when there is none."""
  instances = resample([pipeline.create_instances(docs, rng, settings) if docs else []
                        for docs in corpus.documents], rng, alpha)
  features = [monolingual_features(instance, language, rng, settings)
              for language, rows in enumerate(instances) for instance in rows]
  for source, target, pairs in corpus.parallel:
    for tokens_a, tokens_b in pairs:
      row = translation_features(tokens_a, tokens_b, (source, target), rng, settings)
      if row is not None:
        features.append(row)
  if not features:
    return None
  return pretraining.stack_features([features[k] for k in rng.permutation(len(features))])
