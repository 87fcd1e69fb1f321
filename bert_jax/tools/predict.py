"""Fill-in-the-[MASK] and next-sentence prediction with a pretrained model: the CLI and the API.

  python -m bert_jax.predict --workdir=runs/tiny "the man went to the [MASK] ." [--top_k=5] [--json]
  python -m bert_jax.predict --workdir=runs/tiny "he went to the store ." --next="he bought milk ."

--workdir is a bert_jax pretraining workdir (its newest checkpoint), WORKDIR@STEP (that step's)
(an ELECTRA run's predictions are its generator's, a distillation run's its student's)
or hf:DIR (a transformers BertForPreTraining or BertForMaskedLM directory with its vocab.txt;
RobertaForMaskedLM with vocab.json and merges.txt; AlbertForPreTraining or AlbertForMaskedLM with
spiece.model). Each sentence prints one line per mask token ([MASK]; RoBERTa's <mask>), in
order: the top_k tokens and their probabilities, a softmax over the model's whole vocab as
transformers' fill-mask pipeline computes it. --next prints P(IsNext), the NSP head's
probability that the second sentence follows the first.

Python (a notebook):
  predictor = load('runs/tiny')  # or 'runs/tiny@1500', 'hf:runs/tiny_hf'
  predictor.fill_mask('the man went to the [MASK] .', top_k=5)  # per [MASK]: [(token, p), ...]
  predictor.next_sentence('he went to the store .', 'he bought milk .')  # P(IsNext)

"[MASK]" is written in capitals, as in transformers: the text is split at the special tokens
before the tokenizer, so lowercasing never reaches them; the mask token takes the spaces before
it (transformers' lstrip), so a BPE text never ends in a bare-space piece before it. Forward passes run in float32, whatever the
run trained in, on rows padded to powers of two (one compile per bucket). A causal model
(objectives 'clm') is refused: it reads only the left context, so it cannot fill a gap.
"""

import json
import os
import re
import sys

# `configs` lives at the repository root: make it importable from anywhere (a notebook too).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import logging  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

from bert_jax import models  # pylint: disable=wrong-import-position
from bert_jax.data import tokenizer as tokenizer_lib  # pylint: disable=wrong-import-position

MASK = '[MASK]'
# The mask token of each family's vocab: BERT's and ALBERT's, RoBERTa's.
MASKS = (MASK, '<mask>')
# Rows per forward pass at most; a longer list of sentences runs in several.
MAX_BATCH = 32
# Shortest padded row: short sentences share one compiled shape.
MIN_LENGTH = 8
# The compute path of any device: the GPU kernels are training speedups of the same function.
_INFERENCE_MODEL = {'dtype': 'float32', 'attention_impl': 'xla', 'layer_norm_impl': 'xla',
                    'ffn_impl': 'xla', 'remat_policy': 'none'}
_VALID_SOURCES = ('a bert_jax pretraining workdir (config.json, its vocab files, checkpoints/'
                  'STEP), WORKDIR@STEP or hf:DIR (a transformers BertForPreTraining or '
                  'BertForMaskedLM, RobertaForMaskedLM, AlbertForPreTraining or AlbertForMaskedLM '
                  'directory with config.json, model.safetensors or pytorch_model.bin and its '
                  'vocab: vocab.txt, vocab.json + merges.txt, spiece.model)')


class PredictError(ValueError):
  """A source, sentence or setting predict cannot use; the message names it and what is valid."""


# ---- Text -> ids (pure). ----


def split_special(text: str, specials=tokenizer_lib.SPECIAL_TOKENS) -> list[str]:
  """'a [MASK] b' -> ['a ', '[MASK]', ' b']: special tokens apart from the text around them."""
  pattern = '(' + '|'.join(re.escape(t) for t in sorted(specials, key=len, reverse=True)) + ')'
  return [part for part in re.split(pattern, text) if part]


def mask_token(tokenizer) -> str:
  """The tokenizer's mask token as written in text: [MASK], or RoBERTa's <mask>."""
  return tokenizer.id_to_token(tokenizer.special.mask)


def encode(tokenizer, text: str) -> np.ndarray:
  """The tokenizer's ids of `text` without [CLS]/[SEP]; a written special token is its own id,
  and the mask token takes the spaces before it (transformers' lstrip)."""
  special = {tokenizer.id_to_token(int(i)): int(i) for i in tokenizer.special.ids()}
  parts = split_special(text, tuple(special))
  mask = mask_token(tokenizer)
  parts = [part.rstrip() if following == mask else part
           for part, following in zip(parts, parts[1:] + [''])]
  parts = [part for part in parts if part]
  plain = iter(tokenizer.encode_sentences([p for p in parts if p not in special]))
  pieces = [np.asarray([special[p]], np.int32) if p in special else next(plain) for p in parts]
  return np.concatenate(pieces).astype(np.int32) if pieces else np.zeros((0,), np.int32)


def bucket(n: int, limit: int, least: int = 1) -> int:
  """The power of two >= max(n, least), capped at `limit` (never below n): a padded size that
  many inputs share, so one compiled shape serves them."""
  size = max(least, 1)
  while size < n:
    size *= 2
  return max(min(size, limit), n)


def check_top_k(top_k, vocab_size: int | None = None) -> None:
  """top_k must be a whole number from 1 to the vocab size."""
  bound = f'1 to the vocab size ({vocab_size})' if vocab_size else '1 or more'
  if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1 or (
      vocab_size and top_k > vocab_size):
    raise PredictError(f'top_k={top_k!r}: expected a whole number from {bound}.')


def check_fill_mask_texts(texts, masks=(MASK,)) -> None:
  """Every sentence is text with at least one of `masks` (the model's mask token; before a model
  is loaded, any family's)."""
  mask = masks[0]
  if isinstance(texts, str) or not texts:
    raise PredictError(f'Give a list of sentences with {mask}, e.g. '
                       f'["the man went to the {mask} ."]; got {texts!r}.')
  named = ' or '.join(masks)
  for index, text in enumerate(texts):
    if not isinstance(text, str) or not any(m in text for m in masks):
      upper = [m for m in masks if m != m.lower()]
      hint = (f' (the mask token is written in capitals: {upper[0]})'
              if isinstance(text, str) and upper and upper[0].lower() in text.lower() else '')
      others = [m for m in MASKS if m not in masks and isinstance(text, str) and m in text]
      if others:
        hint = f' ({others[0]} is another family\'s mask token; this model\'s is {mask})'
      raise PredictError(f'Sentence {index + 1} {text!r} has no {named} to fill{hint}; write '
                         f'{mask} where a token is to be predicted, e.g. "the man went to the '
                         f'{mask} .".')


def check_request(sentences: list[str], next_sentence: str | None, top_k) -> None:
  """The command's sentences and flags, checked before anything is loaded."""
  if next_sentence is not None:
    if len(sentences) != 1:
      raise PredictError(f'--next={next_sentence!r} takes exactly one first sentence; got '
                         f'{len(sentences)}: {sentences!r}.')
    for name, text in (('first sentence', sentences[0]), ('--next', next_sentence)):
      if not text.strip():
        raise PredictError(f'The {name} is empty; NSP needs two sentences.')
    return
  check_top_k(top_k)
  if not sentences:
    raise PredictError(f'No sentences given; e.g. python -m bert_jax.predict --workdir=runs/tiny '
                       f'"the man went to the {MASK} ." (or one sentence and --next="...").')
  check_fill_mask_texts(sentences, MASKS)


def pad_rows(rows: list[np.ndarray], length: int, batch_size: int, pad: int = 0) -> dict:
  """Rows of ids ([CLS] ... [SEP]) -> the encoder's inputs [batch_size, length], segment 0,
  padded with `pad`.

  Padding rows repeat the last real row, so that every row attends to something.
  """
  rows = rows + [rows[-1]] * (batch_size - len(rows))
  batch = {'input_ids': np.full((batch_size, length), pad, np.int32),  # [batch, length]
           'input_mask': np.zeros((batch_size, length), np.int32),
           'segment_ids': np.zeros((batch_size, length), np.int32)}
  for i, ids in enumerate(rows):
    batch['input_ids'][i, :len(ids)] = ids
    batch['input_mask'][i, :len(ids)] = 1
  return batch


def mask_positions(input_ids: np.ndarray, mask_id: int, predictions: int) -> np.ndarray:
  """The [MASK] positions of each row, in order, padded with 0 ([CLS], whose logits are not
  read): masked_lm_positions [batch, predictions]."""
  positions = np.zeros((len(input_ids), predictions), np.int32)
  for i, ids in enumerate(input_ids):
    where = np.flatnonzero(ids == mask_id)
    positions[i, :len(where)] = where
  return positions


def top_tokens(probabilities: np.ndarray, top_k: int, tokenizer) -> list[tuple[str, float]]:
  """The top_k (token, probability) of one [MASK]'s distribution [vocab], most probable first.

  Rows past the tokenizer's vocab (a model vocab rounded up) have no token: shown as '[ID n]'.
  """
  order = np.argsort(-probabilities, kind='stable')[:top_k]
  name = lambda i: (tokenizer.id_to_token(i) if i < tokenizer.vocab_size  # noqa: E731
                    else f'[ID {i}]')
  return [(name(int(i)), float(probabilities[i])) for i in order]


def format_fill_mask(text: str, masks: list[list[tuple[str, float]]]) -> str:
  """A sentence, then one line per [MASK]: `  [MASK] 1: store 0.412 | market 0.120`."""
  lines = [text]
  for index, tokens in enumerate(masks, 1):
    lines.append(f'  {MASK} {index}: ' + ' | '.join(f'{t} {p:.3f}' for t, p in tokens))
  return '\n'.join(lines)


# ---- Sources -> (config, params, tokenizer). ----


def parse_source(spec: str) -> tuple[str, str, int | None]:
  """'hf:DIR' -> ('hf', DIR, None); 'WORKDIR[@STEP]' -> ('workdir', WORKDIR, STEP or None)."""
  from bert_jax.interop import init_from  # pylint: disable=g-import-not-at-top
  if not isinstance(spec, str) or not spec.strip():
    raise PredictError(f'--workdir={spec!r}: expected {_VALID_SOURCES}.')
  if spec.startswith('tf:'):
    raise PredictError(f'--workdir={spec!r}: original TF checkpoints are not read here; expected '
                       f'{_VALID_SOURCES}.')
  if spec.startswith('hf:') and re.fullmatch(r'.+@[0-9]+', spec):
    raise PredictError(f'--workdir={spec!r}: hf:DIR holds one set of weights; @STEP names a '
                       'checkpoint of a bert_jax workdir. Drop the @STEP.')
  kind, path = init_from.parse(spec)
  return kind, path, init_from.parse_step(spec) if kind == 'workdir' else None


def _workdir_source(spec: str, workdir: str, step: int | None):
  """(config, params, tokenizer kind, vocab file, lowercase, step) of a pretraining workdir's
  checkpoint."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from bert_jax import objectives  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import init_from  # pylint: disable=g-import-not-at-top
  from bert_jax.core import checkpoint  # pylint: disable=g-import-not-at-top
  config_path = os.path.join(workdir, 'config.json')
  if not os.path.isfile(config_path):
    hf_hint = (' It has a transformers model file: pass hf:' + workdir + '.'
               if os.path.isfile(os.path.join(workdir, 'model.safetensors')) else '')
    raise PredictError(f'--workdir={spec!r}: {config_path} does not exist; expected '
                       f'{_VALID_SOURCES}.{hf_hint}')
  with open(config_path, encoding='utf-8') as f:
    saved = json.load(f)
  if 'model' not in saved:
    raise PredictError(f'--workdir={spec!r}: {config_path} is not a bert_jax run\'s config'
                       + (' (it is a transformers config: pass hf:' + workdir + ')'
                          if 'model_type' in saved else '') + f'; expected {_VALID_SOURCES}.')
  config = ml_collections.ConfigDict(saved)
  if config.get('mode') == 'finetune':
    raise PredictError(f'--workdir={spec!r} is a fine-tuning run: its heads are a task\'s, not '
                       'MLM\'s. Give the pretraining workdir it started from.')
  _check_heads(spec, objectives.parse(config.objectives), config.model.get('causal', False))
  steps = checkpoint.checkpoint_steps(workdir)
  if not steps:
    raise PredictError(f'--workdir={spec!r}: {os.path.join(workdir, "checkpoints")} has no '
                       'checkpoint yet; a run saves every train.checkpoint_every steps and at '
                       'its end.')
  if step is not None and step not in steps:
    raise PredictError(f'--workdir={spec!r}: no checkpoint of step {step}; the steps there are '
                       f'{", ".join(map(str, steps))} (WORKDIR@STEP names one).')
  step = steps[-1] if step is None else step
  try:
    params = init_from.workdir_params(workdir, step)
  except init_from.InitFromError as e:
    raise PredictError(f'--workdir={spec!r}: {e}') from e
  config, params = masked_lm_of(config, params)
  kind = config.data.get('tokenizer', 'wordpiece')
  # A given vocab stays where config.data.vocab_file says.
  vocab_file = (tokenizer_lib.kept_vocab(kind, workdir)
                or os.path.expanduser(config.data.vocab_file))
  if not os.path.isfile(vocab_file):
    raise PredictError(f'--workdir={spec!r} has no {" + ".join(tokenizer_lib.KEPT_FILES[kind])} '
                       f'and config.data.vocab_file={config.data.vocab_file!r} is not a file: its '
                       'token ids have no names.')
  return config, params, kind, vocab_file, bool(config.data.lowercase), step


def _hf_source(spec: str, directory: str):
  """(config, params, tokenizer kind, vocab file, lowercase, None) of a transformers model
  directory; the family is config.json's model_type."""
  from bert_jax.interop import hf  # pylint: disable=g-import-not-at-top
  from bert_jax.models import hf_layout  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import init_from  # pylint: disable=g-import-not-at-top
  from configs import base  # pylint: disable=g-import-not-at-top
  if not os.path.isdir(directory):
    raise PredictError(f'--workdir={spec!r}: {directory} is not a directory; expected '
                       f'{_VALID_SOURCES}.')
  try:
    state_dict, hf_config = hf.load_hf_state_dict(directory)
  except (OSError, ImportError, ValueError) as e:  # Missing, unreadable or unsafe weight files.
    raise PredictError(f'--workdir={spec!r}: {e}') from e
  if hf_config is None:
    raise PredictError(f'--workdir={spec!r}: no config.json in {directory}.')
  config = base.get_config()
  try:
    layout = hf_layout.for_hf_config(hf_config)
    config.model.update(hf.hf_config_to_model_overrides(hf_config))
  except hf.UnsupportedConfigError as e:
    raise PredictError(f'--workdir={spec!r}: {e}') from e
  kind = layout.tokenizer
  vocab_file = tokenizer_lib.kept_vocab(kind, directory)
  if not vocab_file:
    raise PredictError(f'--workdir={spec!r}: {directory} lacks '
                       f'{" + ".join(tokenizer_lib.KEPT_FILES[kind])}; the {layout.display} '
                       "model's token ids need the vocab they were trained with.")
  # Each head's HF key prefix ('cls.predictions.', 'lm_head.', 'sop_classifier.', ...).
  head_prefix = {layout.heads[path.split('/')[0]]: key.rsplit('.', 1)[0] + '.'
                 for path, key, transform in layout.table
                 if transform != 'tied' and path.split('/')[0] in layout.heads}
  present = [name for name, prefix in head_prefix.items()
             if any(k.startswith(prefix) for k in state_dict)]
  if 'mlm' not in present:
    raise PredictError(f'--workdir={spec!r} has no MLM head (no {head_prefix["mlm"]}* weights: '
                       f'a {layout.base_class} or a task model); fill-mask needs a '
                       f'{" or ".join(c for c, _ in layout.head_classes)} checkpoint.')
  config.objectives = ','.join(present)
  _check_heads(spec, ('mlm',), config.model.causal)
  pooler = [(key, path) for path, key, _ in layout.table if path.startswith('bert/pooler/')]
  if present == ['mlm'] and not any(key in state_dict for key, _ in pooler):
    # MaskedLM classes are saved without the pooler; without NSP or SOP nothing reads it.
    h = config.model.hidden_size
    state_dict = {**state_dict, **{key: np.zeros((h, h) if path.endswith('kernel') else (h,),
                                                 np.float32) for key, path in pooler}}
  try:
    params, _ = hf.import_hf(state_dict, config, hf_config=hf_config)
  except ValueError as e:
    raise PredictError(f'--workdir={spec!r}: {e}') from e
  casing = hf.tokenizer_casing(directory)
  if len(set(casing.values())) > 1:
    raise PredictError(f'--workdir={spec!r}: its tokenizer files disagree on casing ({casing}); '
                       'our WordPiece lowercases and strips accents together, or neither.')
  if kind == 'wordpiece':  # Without tokenizer files, BertTokenizer's default: uncased.
    lowercase = next(iter(casing.values()), True)
  else:  # The files' casing, else the family's (RoBERTa cased, ALBERT lowercased).
    lowercase = init_from.source_lowercase(f'hf:{directory}', kind)
  return config, params, kind, vocab_file, lowercase, None


def masked_lm_of(config, params):
  """(config, params) of the masked LM a pretraining run holds: the run's own, but an ELECTRA
  run's ('rtd') generator (its discriminator tells replaced tokens, it predicts none) and a
  distillation run's student without its frozen teacher."""
  from flax import traverse_util  # pylint: disable=g-import-not-at-top
  from bert_jax import objectives  # pylint: disable=g-import-not-at-top
  names = objectives.parse(config.objectives)
  if 'rtd' in names:
    from bert_jax.models import electra  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    flat = electra.generator_params(traverse_util.flatten_dict(params, sep='/'))
    generator = electra.generator_run_config(config)
    # ElectraModel's pooler (fine-tuning's dense + GELU) has no generator weights; no
    # prediction reads the pooled state, so zeros stand in for it.
    width = generator.model.hidden_size
    flat['bert/pooler/dense/kernel'] = np.zeros((width, width), np.float32)
    flat['bert/pooler/dense/bias'] = np.zeros((width,), np.float32)
    return generator, traverse_util.unflatten_dict(flat, sep='/')
  frozen = objectives.resolve(config).frozen_scopes
  if frozen:
    config = config.copy_and_resolve_references()
    config.objectives = ','.join(n for n in names if not objectives.get(n).frozen) or 'mlm'
    params = {k: v for k, v in params.items() if k not in frozen}
  return config, params


# Objectives whose runs hold a masked LM under another objective's name (masked_lm_of).
_HOLDS_A_MASKED_LM = ('rtd', 'distill')


def _check_heads(spec: str, objective_names, causal: bool) -> None:
  if causal or 'clm' in objective_names:
    raise PredictError(f'--workdir={spec!r} is a left-to-right LM (objectives clm, causal '
                       'attention): each token saw only the ones before it, so it cannot fill a '
                       f'{MASK} from both sides and has no NSP head. Give an mlm run.')
  if not any(n in objective_names for n in ('mlm', *_HOLDS_A_MASKED_LM)):
    raise PredictError(f'--workdir={spec!r} has no MLM head (objectives '
                       f'{",".join(objective_names)}); fill-mask needs a run with mlm.')


# ---- The predictor. ----


class Predictor:
  """A pretrained model, its parameters and tokenizer: fill_mask and next_sentence."""

  def __init__(self, source: str, config, params, tokenizer, step: int | None = None):
    import jax  # pylint: disable=g-import-not-at-top
    from bert_jax import objectives  # pylint: disable=g-import-not-at-top
    from bert_jax.train import step as steps  # pylint: disable=g-import-not-at-top
    self.source = source  # What load was given.
    self.step = step  # The checkpoint's step (None for hf:DIR).
    self.config = config
    self.tokenizer = tokenizer
    self.objectives = objectives.parse(config.objectives)
    if tokenizer.vocab_size > config.model.vocab_size:
      raise PredictError(f'{source}: the vocab has {tokenizer.vocab_size} tokens but the model '
                         f'only {config.model.vocab_size} rows; it is not this model\'s vocab.')
    self.model = steps.build_model(config)
    self.params = jax.device_put(params)

    def probabilities(params, batch):
      outputs = self.model.apply({'params': params}, batch)
      # [batch, predictions, vocab] and [batch, 2]
      return {name[:-len('_logits')]: jax.nn.softmax(value.astype('float32'), axis=-1)
              for name, value in outputs.items()}
    self._probabilities = jax.jit(probabilities)  # Compiled once per padded shape.

  @property
  def max_length(self) -> int:
    """Longest row, special tokens included (RoBERTa, XLM-R: 2 position rows fewer, fairseq's)."""
    model = self.config.model
    return model.max_position_embeddings - models.get(model.get('name', 'bert')).position_offset

  def fill_mask(self, text: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
    """Per [MASK] of `text`, in order: its top_k (token, probability), most probable first."""
    return self.fill_masks([text], top_k)[0]

  def fill_masks(self, texts: list[str], top_k: int = 5) -> list[list[list[tuple[str, float]]]]:
    """fill_mask of each text, batched: sentences share forward passes."""
    check_fill_mask_texts(texts, (mask_token(self.tokenizer),))
    check_top_k(top_k, self.config.model.vocab_size)
    cls, sep = self.tokenizer.special.cls, self.tokenizer.special.sep
    rows = [self._checked_row([cls, *encode(self.tokenizer, t), sep], t) for t in texts]
    results = []
    for start in range(0, len(rows), MAX_BATCH):
      chunk = rows[start:start + MAX_BATCH]
      counts = [int(np.sum(r == self.tokenizer.special.mask)) for r in chunk]
      batch = pad_rows(chunk, bucket(max(map(len, chunk)), self.max_length, MIN_LENGTH),
                       bucket(len(chunk), MAX_BATCH), self.tokenizer.special.pad)
      batch['masked_lm_positions'] = mask_positions(
          batch['input_ids'], self.tokenizer.special.mask, bucket(max(counts), self.max_length))
      probabilities = np.asarray(self._probabilities(self.params, batch)['mlm'])
      results += [[top_tokens(probabilities[i, j], top_k, self.tokenizer) for j in range(count)]
                  for i, count in enumerate(counts)]
    return results

  def next_sentence(self, first: str, second: str) -> float:
    """P(IsNext): the NSP head's probability that `second` follows `first` (label 0)."""
    if 'nsp' not in self.objectives:
      raise PredictError(f'{self.source} has no NSP head (objectives {self.config.objectives}: '
                         'trained without next-sentence prediction, or a BertForMaskedLM '
                         'checkpoint); next_sentence needs an mlm,nsp run.')
    special = self.tokenizer.special
    a, b = encode(self.tokenizer, first), encode(self.tokenizer, second)
    ids = self._checked_row([special.cls, *a, special.sep, *b, special.sep],
                            f'{first} / {second}')
    batch = pad_rows([ids], bucket(len(ids), self.max_length, MIN_LENGTH), 1, special.pad)
    batch['segment_ids'][0, len(a) + 2:len(ids)] = 1  # B and its [SEP].
    batch['masked_lm_positions'] = np.zeros((1, 1), np.int32)  # The MLM head's, unread.
    return float(self._probabilities(self.params, batch)['nsp'][0, 0])

  def _checked_row(self, ids, text: str) -> np.ndarray:
    if len(ids) > self.max_length:
      raise PredictError(f'{text[:80]!r} is {len(ids)} tokens with [CLS] and [SEP]; the model '
                         f'takes at most {self.max_length} (max_position_embeddings).')
    return np.asarray(ids, np.int32)


def load(spec: str) -> Predictor:
  """The Predictor of 'WORKDIR', 'WORKDIR@STEP' or 'hf:DIR'; PredictError naming what is wrong."""
  kind, path, step = parse_source(spec)
  if kind == 'hf':
    config, params, tokenizer_kind, vocab_file, lowercase, step = _hf_source(spec, path)
  else:
    config, params, tokenizer_kind, vocab_file, lowercase, step = _workdir_source(spec, path,
                                                                                   step)
  for key, value in _INFERENCE_MODEL.items():
    if key in config.model:
      config.model[key] = value
  try:
    tokenizer = tokenizer_lib.load_tokenizer(tokenizer_kind, vocab_file, lowercase)
  except (OSError, ValueError) as e:
    raise PredictError(f'--workdir={spec!r}: {e}') from e
  return Predictor(spec, config, params, tokenizer, step)


# ---- The command. ----


def define_flags() -> None:
  """The command's flags; defined only when it runs, so the Python API adds none to absl's."""
  flags.DEFINE_string('workdir', None, f'Where the model is: {_VALID_SOURCES}.')
  flags.DEFINE_integer('top_k', 5, f'Tokens shown per {MASK}, most probable first.')
  flags.DEFINE_string('next', None, 'NSP: a sentence that may follow the one sentence given; '
                      'prints P(IsNext).')
  flags.DEFINE_bool('json', False, 'Print one JSON document instead of text.')
  flags.mark_flag_as_required('workdir')


def parse_flags(argv):
  """absl's parsing, with one-line errors and a --help of this docstring and the flags."""
  if any(arg in ('--help', '-help', '--helpshort', '-h', '-?') for arg in argv[1:]):
    print(f'{__doc__.strip()}\n\nflags:\n{flags.FLAGS.module_help(__name__)}')
    sys.exit(0)
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    sys.exit(f'Invalid flags: {e}\nPass --help for the flags.')


def main(argv) -> None:
  """Prints the predictions of the sentences in argv[1:]."""
  logging.set_verbosity(logging.WARNING)
  sentences, args = argv[1:], flags.FLAGS
  try:
    check_request(sentences, args.next, args.top_k)
    predictor = load(args.workdir)
    where = f'{args.workdir}' + (f' (step {predictor.step})' if predictor.step is not None else '')
    if args.next is not None:
      p = predictor.next_sentence(sentences[0], args.next)
      print(json.dumps({'source': args.workdir, 'step': predictor.step, 'first': sentences[0],
                        'second': args.next, 'is_next': p}) if args.json else
            f'{where}\n{sentences[0]}\n{args.next}\n  P(IsNext) {p:.3f}')
      return
    results = predictor.fill_masks(sentences, args.top_k)
  except PredictError as e:
    sys.exit(f'predict: {e}')
  if args.json:
    print(json.dumps({'source': args.workdir, 'step': predictor.step, 'predictions': [
        {'text': text, 'masks': [[{'token': t, 'probability': p} for t, p in tokens]
                                 for tokens in masks]}
        for text, masks in zip(sentences, results)]}))
  else:
    print('\n'.join([where] + [format_fill_mask(t, m) for t, m in zip(sentences, results)]))


def run_command() -> None:
  from bert_jax.core import chips  # pylint: disable=g-import-not-at-top
  from bert_jax.core import errors  # pylint: disable=g-import-not-at-top
  chips.quiet_absent_tpu()  # Before JAX starts.
  errors.quiet_closed_loop_echoes()
  define_flags()
  app.run(main, flags_parser=parse_flags)


if __name__ == '__main__':
  run_command()
