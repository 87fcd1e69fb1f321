"""Hugging Face BERT <-> our parameters: one mapping table, import, export, file loading.

HF `BertForPreTraining` / `BertModel` state dicts differ from our tree (docs/ARCHITECTURE.md,
"Parameters") by a `bert.` prefix, `.weight` names, [out, in] Linear kernels and flat heads; every
key maps by one row of TABLE, and any key no row explains is an error, never a guess. The CLI
and the Python entry points are in convert.py.
"""

import dataclasses
import json
import math
import os
import re
import shutil

from absl import logging
import flax.linen as nn
import jax
import numpy as np
import safetensors
import safetensors.numpy

from bert_jax.models import layers
from bert_jax import objectives
from bert_jax.models import bert as model_lib
from bert_jax.models import pretraining
from bert_jax.train import step as steps

# (our path, HF key, transform). `{n}` is the layer; ours is the unscanned name, which the scanned
# tree stacks along a leading axis as bert/encoder/layer/... Backbone keys are written with the
# `bert.` prefix of BertForPreTraining; BertModel checkpoints have them without it.
TABLE = (
    ('bert/embeddings/word_embeddings', 'bert.embeddings.word_embeddings.weight', 'none'),
    ('bert/embeddings/position_embeddings', 'bert.embeddings.position_embeddings.weight', 'none'),
    ('bert/embeddings/token_type_embeddings', 'bert.embeddings.token_type_embeddings.weight',
     'none'),
    ('bert/embeddings/LayerNorm/scale', 'bert.embeddings.LayerNorm.weight', 'none'),
    ('bert/embeddings/LayerNorm/bias', 'bert.embeddings.LayerNorm.bias', 'none'),
    ('bert/encoder/layer_{n}/attention/self/query/kernel',
     'bert.encoder.layer.{n}.attention.self.query.weight', 'transpose_split_out'),
    ('bert/encoder/layer_{n}/attention/self/query/bias',
     'bert.encoder.layer.{n}.attention.self.query.bias', 'split'),
    ('bert/encoder/layer_{n}/attention/self/key/kernel',
     'bert.encoder.layer.{n}.attention.self.key.weight', 'transpose_split_out'),
    ('bert/encoder/layer_{n}/attention/self/key/bias',
     'bert.encoder.layer.{n}.attention.self.key.bias', 'split'),
    ('bert/encoder/layer_{n}/attention/self/value/kernel',
     'bert.encoder.layer.{n}.attention.self.value.weight', 'transpose_split_out'),
    ('bert/encoder/layer_{n}/attention/self/value/bias',
     'bert.encoder.layer.{n}.attention.self.value.bias', 'split'),
    ('bert/encoder/layer_{n}/attention/output/dense/kernel',
     'bert.encoder.layer.{n}.attention.output.dense.weight', 'transpose_split_in'),
    ('bert/encoder/layer_{n}/attention/output/dense/bias',
     'bert.encoder.layer.{n}.attention.output.dense.bias', 'none'),
    ('bert/encoder/layer_{n}/attention/output/LayerNorm/scale',
     'bert.encoder.layer.{n}.attention.output.LayerNorm.weight', 'none'),
    ('bert/encoder/layer_{n}/attention/output/LayerNorm/bias',
     'bert.encoder.layer.{n}.attention.output.LayerNorm.bias', 'none'),
    ('bert/encoder/layer_{n}/intermediate/dense/kernel',
     'bert.encoder.layer.{n}.intermediate.dense.weight', 'transpose'),
    ('bert/encoder/layer_{n}/intermediate/dense/bias',
     'bert.encoder.layer.{n}.intermediate.dense.bias', 'none'),
    ('bert/encoder/layer_{n}/output/dense/kernel', 'bert.encoder.layer.{n}.output.dense.weight',
     'transpose'),
    ('bert/encoder/layer_{n}/output/dense/bias', 'bert.encoder.layer.{n}.output.dense.bias',
     'none'),
    ('bert/encoder/layer_{n}/output/LayerNorm/scale',
     'bert.encoder.layer.{n}.output.LayerNorm.weight', 'none'),
    ('bert/encoder/layer_{n}/output/LayerNorm/bias', 'bert.encoder.layer.{n}.output.LayerNorm.bias',
     'none'),
    ('bert/pooler/dense/kernel', 'bert.pooler.dense.weight', 'transpose'),
    ('bert/pooler/dense/bias', 'bert.pooler.dense.bias', 'none'),
    ('predictions/transform_dense/kernel', 'cls.predictions.transform.dense.weight', 'transpose'),
    ('predictions/transform_dense/bias', 'cls.predictions.transform.dense.bias', 'none'),
    ('predictions/transform_LayerNorm/scale', 'cls.predictions.transform.LayerNorm.weight', 'none'),
    ('predictions/transform_LayerNorm/bias', 'cls.predictions.transform.LayerNorm.bias', 'none'),
    ('predictions/output_bias', 'cls.predictions.bias', 'none'),
    # HF's decoder is tied to these two: optional on import (checked equal), written on export.
    ('bert/embeddings/word_embeddings', 'cls.predictions.decoder.weight', 'tied'),
    ('predictions/output_bias', 'cls.predictions.decoder.bias', 'tied'),
    ('seq_relationship/kernel', 'cls.seq_relationship.weight', 'transpose'),
    ('seq_relationship/bias', 'cls.seq_relationship.bias', 'none'),
)

# Buffers, not parameters: older transformers saved them; they carry nothing to import.
IGNORED_KEYS = re.compile(r'^(bert\.)?embeddings\.(position_ids|token_type_ids)$')
# Subtrees a BertModel checkpoint lacks; merge_missing fills them from a fresh init.
HEAD_SUBTREES = ('predictions', 'seq_relationship')
# Leaves whose first axis is the vocab: resized together by resize_vocab.
VOCAB_PATHS = ('bert/embeddings/word_embeddings', 'predictions/output_bias')
# Original TF names kept by old pytorch_model.bin files; from_pretrained renames them too.
_LEGACY_NAMES = ((re.compile(r'(LayerNorm)\.gamma$'), r'\1.weight'),
                 (re.compile(r'(LayerNorm)\.beta$'), r'\1.bias'))
_LAYER = re.compile(r'^bert/encoder/layer_(\d+)/(.*)$')


def _shape_of(name, shape):
  """HF shape of a leaf of ours of `shape` under transform `name`."""
  shape = tuple(shape)
  return {'none': shape, 'tied': shape, 'transpose': shape[::-1],
          'split': (math.prod(shape),),
          'transpose_split_out': (math.prod(shape[1:]), shape[0]),
          'transpose_split_in': (shape[-1], math.prod(shape[:-1]))}[name]


def _to_ours(name, x, shape):
  """HF array -> ours; HF Linear weights are [out, in], ours [in, out] with heads split out."""
  if name in ('transpose', 'transpose_split_out', 'transpose_split_in'):
    x = x.T
  return x.reshape(shape)


def _to_hf(name, x):
  """Our array -> HF layout, the inverse of _to_ours."""
  if name == 'split':
    return x.reshape(-1)
  if name == 'transpose_split_out':  # [H, A, D] -> [A*D, H]
    return x.reshape(x.shape[0], -1).T
  if name == 'transpose_split_in':  # [A, D, H] -> [H, A*D]
    return x.reshape(-1, x.shape[-1]).T
  return x.T if name == 'transpose' else x


class CheckpointMismatchError(ValueError):
  """A checkpoint or parameter tree does not fit the model; lists every problem at once."""

  def __init__(self, what: str, problems: list[str]):
    self.problems = list(problems)
    super().__init__(f'{what}: {len(self.problems)} problem(s):\n'
                     + '\n'.join(f'  - {p}' for p in self.problems))


class UnsafeCheckpointError(ValueError):
  """A weights file that would need unpickling arbitrary objects, or an index that names files
  outside its model directory; never loaded."""


class UnsupportedConfigError(ValueError):
  """An HF config uses a feature our model does not implement."""


class CasingMismatchError(ValueError):
  """A tokenizer's lowercasing disagrees with config.data.lowercase."""


@dataclasses.dataclass(frozen=True)
class Entry:
  """One HF key and the (unscanned) leaf of ours it maps to."""
  hf_key: str
  path: str
  transform: str

  @property
  def group(self) -> str:
    """'backbone', 'mlm' or 'nsp'."""
    return {'bert': 'backbone', 'predictions': 'mlm'}.get(self.path.split('/')[0], 'nsp')


def entries(num_layers: int, prefix: str = 'bert.') -> list[Entry]:
  """TABLE expanded over layers, with backbone keys under `prefix` ('' for BertModel)."""
  out = []
  for path, key, transform in TABLE:
    if key.startswith('bert.'):
      key = prefix + key[len('bert.'):]
    for n in range(num_layers) if '{n}' in path else [None]:
      out.append(Entry(key.replace('{n}', str(n)), path.replace('{n}', str(n)), transform))
  return out


@dataclasses.dataclass
class ImportReport:
  """What import_hf read, skipped and changed."""
  layout: str  # 'BertForPreTraining' (bert./cls. keys), 'BertModel' (no prefix, no heads), ...
  loaded: int = 0  # HF keys mapped into the params.
  missing_heads: list = dataclasses.field(default_factory=list)  # Our subtrees to merge_missing.
  skipped: list = dataclasses.field(default_factory=list)  # 'key: why' for keys not loaded.
  ignored: list = dataclasses.field(default_factory=list)  # Buffers (IGNORED_KEYS).
  renamed: list = dataclasses.field(default_factory=list)  # Legacy gamma/beta keys.
  tied_checked: list = dataclasses.field(default_factory=list)  # Tied copies found equal.
  vocab_rows_added: int = 0
  vocab_rows_removed: int = 0

  def summary(self) -> str:
    """A few lines for logs and the CLI."""
    lines = [f'layout {self.layout}: {self.loaded} keys loaded']
    if self.missing_heads:
      lines.append(f'heads not in the checkpoint (fill with merge_missing): {self.missing_heads}')
    lines += [f'skipped {s}' for s in self.skipped]
    if self.ignored:
      lines.append(f'ignored buffers: {self.ignored}')
    if self.renamed:
      lines.append(f'read {len(self.renamed)} legacy LayerNorm gamma/beta keys as weight/bias')
    if self.tied_checked:
      lines.append(f'tied copies equal to their parameter: {self.tied_checked}')
    if self.vocab_rows_added or self.vocab_rows_removed:
      lines.append(f'vocab resized: {self.vocab_rows_added} rows added, '
                   f'{self.vocab_rows_removed} removed')
    return '\n'.join(lines)


# HF hidden_act -> our model.gelu ('erf' exact, 'tanh' approximation); export writes the first.
HF_GELU = {'gelu': 'erf', 'gelu_new': 'tanh', 'gelu_pytorch_tanh': 'tanh'}


def hf_config_to_model_overrides(hf_config: dict) -> dict:
  """HF BertConfig dict -> our config.model values; UnsupportedConfigError on what we lack."""
  problems = []
  if hf_config.get('model_type', 'bert') != 'bert':
    problems.append(f'model_type={hf_config["model_type"]!r}; only "bert" maps onto our model')
  act = hf_config.get('hidden_act', 'gelu')
  if act not in HF_GELU:
    # 'relu' or others would change every activation.
    problems.append(f'hidden_act={act!r}; our model implements {sorted(HF_GELU)}')
  if hf_config.get('position_embedding_type', 'absolute') != 'absolute':
    problems.append(f'position_embedding_type={hf_config["position_embedding_type"]!r}; '
                    'our model has learned absolute positions only')
  if hf_config.get('add_cross_attention'):
    problems.append('add_cross_attention=true; our model has no cross-attention')
  if hf_config.get('hidden_size', 768) % hf_config.get('num_attention_heads', 12):
    problems.append('hidden_size is not a multiple of num_attention_heads')
  if problems:
    raise UnsupportedConfigError('Unsupported HF BERT config: ' + '; '.join(problems) + '.')
  names = {'vocab_size': 'vocab_size', 'hidden_size': 'hidden_size',
           'num_hidden_layers': 'num_layers', 'num_attention_heads': 'num_heads',
           'intermediate_size': 'intermediate_size',
           'max_position_embeddings': 'max_position_embeddings',
           'type_vocab_size': 'type_vocab_size', 'layer_norm_eps': 'layer_norm_eps',
           'initializer_range': 'initializer_range',
           'hidden_dropout_prob': 'hidden_dropout_rate',
           'attention_probs_dropout_prob': 'attention_dropout_rate'}
  overrides = {ours: hf_config[hf] for hf, ours in names.items() if hf in hf_config}
  overrides['gelu'] = HF_GELU[act]
  if hf_config.get('is_decoder'):  # A left-to-right LM (BertLMHeadModel): causal attention.
    overrides['causal'] = True
  return overrides


def has_nsp(config) -> bool:
  """Whether the run's model has the NSP head (config.objectives names 'nsp')."""
  return 'nsp' in objectives.parse(config.objectives)


def model_to_hf_config(config) -> dict:
  """Our full config -> an HF BertConfig dict (BertForMaskedLM when there is no NSP head,
  BertLMHeadModel, a decoder, with causal attention)."""
  m = config.model
  causal = bool(m.get('causal', False))
  return {
      'architectures': ['BertLMHeadModel' if causal else
                        'BertForPreTraining' if has_nsp(config) else 'BertForMaskedLM'],
      'model_type': 'bert', 'vocab_size': m.vocab_size, 'hidden_size': m.hidden_size,
      'num_hidden_layers': m.num_layers, 'num_attention_heads': m.num_heads,
      'intermediate_size': m.intermediate_size,
      'hidden_act': 'gelu' if m.gelu == 'erf' else 'gelu_new',
      'hidden_dropout_prob': m.hidden_dropout_rate,
      'attention_probs_dropout_prob': m.attention_dropout_rate,
      'max_position_embeddings': m.max_position_embeddings,
      'type_vocab_size': m.type_vocab_size, 'initializer_range': m.initializer_range,
      'layer_norm_eps': m.layer_norm_eps, 'pad_token_id': 0,
      'position_embedding_type': 'absolute', 'is_decoder': causal, 'tie_word_embeddings': True,
  }


def leaf_shapes(config) -> dict:
  """{unscanned path: shape} of every parameter the model has, NSP head included."""
  cfg = dataclasses.replace(model_lib.BertConfig.from_config(config), scan_layers=False)
  model = pretraining.PretrainingModel(cfg, ('mlm', 'nsp'))
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), steps.dummy_batch(1, 2, 1))
  return {k: tuple(v.shape) for k, v in _flatten(nn.meta.unbox(shapes['params'])).items()}


def _flatten(tree, prefix=''):
  """Nested dicts -> {'a/b/c': leaf}."""
  out = {}
  for key, value in tree.items():
    if hasattr(value, 'items'):
      out.update(_flatten(value, f'{prefix}{key}/'))
    else:
      out[f'{prefix}{key}'] = value
  return out


def _unflatten(flat):
  """{'a/b/c': leaf} -> nested dicts."""
  tree = {}
  for path, value in flat.items():
    *parents, leaf = path.split('/')
    node = tree
    for name in parents:
      node = node.setdefault(name, {})
    node[leaf] = value
  return tree


def _stack_layers(flat, num_layers):
  """Unscanned bert/encoder/layer_N/... leaves -> scanned bert/encoder/layer/... [L, ...]."""
  out = {k: v for k, v in flat.items() if not _LAYER.match(k)}
  rests = sorted({_LAYER.match(k).group(2) for k in flat if _LAYER.match(k)})
  for rest in rests:
    out[f'bert/encoder/layer/{rest}'] = np.stack(
        [flat[f'bert/encoder/layer_{n}/{rest}'] for n in range(num_layers)])
  return out


def _unstack_layers(flat):
  """Scanned bert/encoder/layer/... [L, ...] -> unscanned bert/encoder/layer_N/... leaves."""
  out = {}
  for path, value in flat.items():
    if path.startswith('bert/encoder/layer/'):
      for n, layer in enumerate(value):
        out[path.replace('/layer/', f'/layer_{n}/', 1)] = layer
    else:
      out[path] = value
  return out


def _detect_layout(keys):
  """(layout name, backbone prefix, has heads) from the key names."""
  prefixed = any(k.startswith('bert.') for k in keys)
  bare = any(k.startswith(('embeddings.', 'encoder.', 'pooler.')) for k in keys)
  heads = any(k.startswith('cls.') for k in keys)
  reason = ('both bert.* and unprefixed backbone keys' if prefixed and bare else
            'no BERT backbone keys' if not (prefixed or bare) else
            'cls.* heads next to an unprefixed backbone' if heads and not prefixed else '')
  if reason:
    raise CheckpointMismatchError('Unrecognised state dict', [
        f'expected BertForPreTraining keys (bert.*, cls.*) or BertModel keys (embeddings.*, '
        f'encoder.*, pooler.*) but found {reason}; first keys: {sorted(keys)[:5]}'])
  if not prefixed:
    return 'BertModel', '', False
  return ('BertForPreTraining' if heads else 'BertModel (bert.-prefixed)'), 'bert.', heads


def _canonical_keys(state_dict, report):
  """Renames legacy LayerNorm gamma/beta keys to weight/bias, as from_pretrained does."""
  out = {}
  for key, value in state_dict.items():
    new = key
    for pattern, replacement in _LEGACY_NAMES:
      new = pattern.sub(replacement, new)
    if new != key:
      report.renamed.append(key)
    out[new] = value
  return out


def _config_problems(hf_config, config, resize_vocab):
  """Disagreements between an HF config and config.model that shapes alone cannot reveal."""
  try:
    overrides = hf_config_to_model_overrides(hf_config)
  except UnsupportedConfigError as e:
    return [str(e)]
  checked = ['hidden_size', 'num_layers', 'num_heads', 'intermediate_size',
             'max_position_embeddings', 'type_vocab_size', 'layer_norm_eps']
  if not resize_vocab:
    checked.append('vocab_size')
  return [f'HF config {name}={overrides[name]} but config.model.{name}={config.model[name]}'
          for name in checked if name in overrides and overrides[name] != config.model[name]]


def _plan(state_dict, config, hf_config, resize_vocab, report):
  """Validates everything first; returns (entries to load, our leaf shapes, checkpoint vocab)."""
  layout, prefix, heads = _detect_layout(state_dict)
  report.layout = layout
  shapes = leaf_shapes(config)
  table = entries(config.model.num_layers, prefix)
  problems = [] if hf_config is None else _config_problems(hf_config, config, resize_vocab)
  word_key = prefix + 'embeddings.word_embeddings.weight'
  vocab = config.model.vocab_size
  if word_key in state_dict and np.ndim(state_dict[word_key]) == 2:
    vocab = state_dict[word_key].shape[0]
    if vocab != config.model.vocab_size and not resize_vocab:
      problems.append(f'vocab size: the checkpoint has {vocab} rows but config.model.vocab_size='
                      f'{config.model.vocab_size}; pass resize_vocab=True to truncate or add rows')
  wanted = {'backbone'} | ({'mlm', 'nsp'} if heads else set())
  if not heads:
    report.missing_heads = ['predictions'] + (['seq_relationship'] if has_nsp(config) else [])
  load, known = [], set()
  for e in table:
    known.add(e.hf_key)
    if e.group not in wanted:
      continue
    if e.group == 'nsp' and not has_nsp(config):
      if e.hf_key in state_dict:
        report.skipped.append(f'{e.hf_key}: config.objectives has no nsp, the model has no NSP '
                              'head')
      continue
    if e.hf_key not in state_dict:
      if e.transform != 'tied':
        hint = (" (an MLM-only checkpoint? set config.objectives='mlm')" if e.group == 'nsp'
                else '')
        problems.append(f'missing key {e.hf_key} (for {e.path}){hint}')
      continue
    expected = list(_shape_of(e.transform, shapes[e.path]))
    if e.path in VOCAB_PATHS:
      expected[0] = vocab  # A vocab mismatch is reported once above, not per key.
    got = np.shape(state_dict[e.hf_key])
    if tuple(expected) != tuple(got):
      problems.append(f'wrong shape for {e.hf_key}: expected {tuple(expected)}, got {tuple(got)}')
    elif not np.issubdtype(np.asarray(state_dict[e.hf_key]).dtype, np.floating):
      problems.append(f'{e.hf_key} has dtype {np.asarray(state_dict[e.hf_key]).dtype}, not float')
    else:
      load.append(e)
  for key in sorted(state_dict):
    if IGNORED_KEYS.match(key):
      report.ignored.append(key)
    elif key not in known:
      problems.append(f'unexpected key {key} {tuple(np.shape(state_dict[key]))}')
  problems += _tied_problems(state_dict, [e for e in load if e.transform == 'tied'], table, report)
  if problems:
    raise CheckpointMismatchError(f'Checkpoint ({layout}) does not fit the model', problems)
  return [e for e in load if e.transform != 'tied'], shapes, vocab


def _tied_problems(state_dict, tied, table, report):
  """A tied copy must equal its parameter: our model cannot hold two different matrices."""
  primary = {e.path: e.hf_key for e in table if e.transform != 'tied'}
  problems = []
  for e in tied:
    source = primary[e.path]
    if source in state_dict and np.shape(state_dict[source]) == np.shape(state_dict[e.hf_key]):
      if np.array_equal(state_dict[source], state_dict[e.hf_key]):
        report.tied_checked.append(e.hf_key)
      else:
        problems.append(f'{e.hf_key} differs from {source}; our model ties them (untied '
                        'decoders are not supported)')
  return problems


def import_hf(state_dict: dict, config, *, hf_config: dict | None = None,
              resize_vocab: bool = False, seed: int = 0):
  """HF state dict -> (params, ImportReport): float32 numpy in our layout, scanned per config.

  Raises CheckpointMismatchError listing every missing, unexpected and misshapen key (and, when
  hf_config is given, every architecture field that disagrees with config.model) before building.
  BertModel checkpoints have no heads: those subtrees are left out and named in
  report.missing_heads; merge_missing fills them.
  """
  report = ImportReport(layout='')
  state_dict = _canonical_keys(state_dict, report)
  load, shapes, vocab = _plan(state_dict, config, hf_config, resize_vocab, report)
  flat = {}
  for e in load:
    shape = list(shapes[e.path])
    if e.path in VOCAB_PATHS:
      shape[0] = vocab
    value = np.asarray(state_dict[e.hf_key], dtype=np.float32)
    flat[e.path] = np.ascontiguousarray(_to_ours(e.transform, value, tuple(shape)))
  report.loaded = len(load)
  if vocab != config.model.vocab_size:
    _resize_vocab(flat, config, seed, report)
  if config.model.scan_layers:
    flat = _stack_layers(flat, config.model.num_layers)
  return _unflatten(flat), report


def _resize_vocab(flat, config, seed, report):
  """Truncates or extends the vocab rows: new embeddings as the model's init, output bias 0."""
  target = config.model.vocab_size
  rows = flat['bert/embeddings/word_embeddings'].shape[0]
  report.vocab_rows_added, report.vocab_rows_removed = max(target - rows, 0), max(rows - target, 0)
  for path in VOCAB_PATHS:
    if path not in flat:  # A BertModel checkpoint has no output bias.
      continue
    value = flat[path][:target]
    if path == 'predictions/output_bias':
      extra = np.zeros((target - len(value),), np.float32)
    else:
      init = layers.truncated_normal(config.model.initializer_range)
      extra = np.asarray(init(jax.random.PRNGKey(seed), (target - len(value),) + value.shape[1:]))
    flat[path] = np.concatenate([value, extra.astype(np.float32)])


def init_params(config, seed: int = 0):
  """Fresh float32 numpy params of config's model (the same init as training)."""
  model = steps.build_model(config)
  batch = {k: np.zeros(v.shape, v.dtype)
           for k, v in steps.dummy_batch(1, 2, 1, objectives=model.objectives).items()}
  variables = jax.jit(model.init)(jax.random.PRNGKey(seed), batch)
  return jax.tree.map(np.asarray, nn.meta.unbox(variables['params']))


def merge_missing(params, fresh_params):
  """Fills the head subtrees absent from `params` from `fresh_params`; anything else is an error."""
  fresh = _flatten(nn.meta.unbox(fresh_params))
  flat = _flatten(params)
  problems = [f'{path} is not a parameter of the model' for path in flat if path not in fresh]
  for path, value in fresh.items():
    if path not in flat:
      if path.split('/')[0] in HEAD_SUBTREES:
        flat[path] = np.asarray(value, np.float32)
      else:
        problems.append(f'missing {path}; only {list(HEAD_SUBTREES)} may come from a fresh init')
    elif np.shape(flat[path]) != np.shape(value):
      problems.append(f'{path}: shape {np.shape(flat[path])} but the model has {np.shape(value)}')
  if problems:
    raise CheckpointMismatchError('Cannot merge the parameters', problems)
  return _unflatten(flat)


def export_hf(params, config, out_dir: str) -> list[str]:
  """Writes out_dir/config.json and model.safetensors (torch layout, float32); returns the keys.

  The tied decoder weight and bias are written too, so any transformers version loads the MLM
  head without missing keys. Without NSP (no 'nsp' in config.objectives) there is no NSP head:
  config.json names BertForMaskedLM, which loads cleanly (it drops the pooler, which nothing
  trained); BertForPreTraining would randomly initialise cls.seq_relationship. A causal model
  (config.model.causal, the clm objective) is written as a decoder, BertLMHeadModel.
  """
  flat = {k: np.asarray(v, np.float32) for k, v in _flatten(nn.meta.unbox(params)).items()}
  if config.model.scan_layers:
    flat = _unstack_layers(flat)
  shapes = leaf_shapes(config)
  if not has_nsp(config):
    shapes = {k: v for k, v in shapes.items() if not k.startswith('seq_relationship/')}
  problems = [f'missing {k}' for k in shapes if k not in flat]
  problems += [f'unexpected {k}' for k in flat if k not in shapes]
  problems += [f'wrong shape for {k}: expected {shapes[k]}, got {v.shape}'
               for k, v in flat.items() if k in shapes and v.shape != shapes[k]]
  if problems:
    raise CheckpointMismatchError('Parameters do not fit config.model', problems)
  tensors = {e.hf_key: np.ascontiguousarray(_to_hf(e.transform, flat[e.path]))
             for e in entries(config.model.num_layers) if e.path in flat}
  if not has_nsp(config) and not config.model.get('causal', False):
    logging.warning("config.objectives has no 'nsp': no NSP head is exported. BertForMaskedLM "
                    'loads the checkpoint fully; BertForPreTraining would randomly initialise '
                    'cls.seq_relationship.')
  os.makedirs(out_dir, exist_ok=True)
  # transformers reads the 'pt' format tag to know the layout is torch's.
  safetensors.numpy.save_file(tensors, os.path.join(out_dir, 'model.safetensors'),
                              metadata={'format': 'pt'})
  with open(os.path.join(out_dir, 'config.json'), 'w', encoding='utf-8') as f:
    json.dump(model_to_hf_config(config), f, indent=2, sort_keys=True)
    f.write('\n')
  return sorted(tensors)


def export_tokenizer(vocab_file: str, lowercase: bool, out_dir: str, max_length: int) -> None:
  """Copies vocab.txt and writes a tokenizer_config.json whose casing matches training."""
  os.makedirs(out_dir, exist_ok=True)
  shutil.copyfile(os.path.expanduser(vocab_file), os.path.join(out_dir, 'vocab.txt'))
  settings = {'tokenizer_class': 'BertTokenizer', 'do_lower_case': lowercase,
              'strip_accents': None, 'tokenize_chinese_chars': True,
              'model_max_length': max_length, 'unk_token': '[UNK]', 'sep_token': '[SEP]',
              'pad_token': '[PAD]', 'cls_token': '[CLS]', 'mask_token': '[MASK]'}
  with open(os.path.join(out_dir, 'tokenizer_config.json'), 'w', encoding='utf-8') as f:
    json.dump(settings, f, indent=2)
    f.write('\n')


def load_hf_state_dict(path_or_dir: str):
  """(state dict of numpy arrays, config.json dict or None) from an HF model dir or file.

  Reads model.safetensors (also sharded, via its index) without torch, else pytorch_model.bin.
  """
  path = os.path.expanduser(path_or_dir)
  directory = path if os.path.isdir(path) else os.path.dirname(path)
  if os.path.isdir(path):
    names = ('model.safetensors', 'model.safetensors.index.json', 'pytorch_model.bin')
    found = [n for n in names if os.path.isfile(os.path.join(path, n))]
    if not found:
      raise FileNotFoundError(f'{path} has none of {list(names)}.')
    path = os.path.join(path, found[0])
  if path.endswith('.index.json'):
    state_dict = {}
    for shard in _index_shards(path, directory):
      state_dict.update(_read_safetensors(shard))
  elif path.endswith('.safetensors'):
    state_dict = _read_safetensors(path)
  else:
    state_dict = _read_torch(path)
  config_path = os.path.join(directory, 'config.json')
  hf_config = None
  if os.path.isfile(config_path):
    with open(config_path, encoding='utf-8') as f:
      hf_config = json.load(f)
  return state_dict, hf_config


def _index_shards(index_path: str, directory: str) -> list[str]:
  """The shard files a model.safetensors.index.json's weight_map names, each checked to lie in
  `directory`: the index is data that came with the download, and a name like
  '../../x.safetensors', an absolute path or a symlink out of the directory would read a file
  that is not part of the model."""
  try:
    with open(index_path, encoding='utf-8') as f:
      weight_map = json.load(f).get('weight_map')
  except (ValueError, AttributeError) as e:  # Not JSON, or JSON but not an object.
    raise ValueError(f'{index_path} is not a safetensors index (a JSON object with a '
                     f'weight_map): {e}') from e
  if not isinstance(weight_map, dict) or not weight_map:
    raise ValueError(f'{index_path} has no weight_map of parameter names to shard files.')
  paths = [model_file(directory, shard, f'{index_path}: weight_map entry {name!r} -> {shard!r}')
           for name, shard in weight_map.items()]
  return sorted(set(paths))


def model_file(directory: str, name, what: str) -> str:
  """directory/name for a file name read from inside a model directory; UnsafeCheckpointError
  (naming `what`) when it is not a plain relative name, or leads or links out of the directory.

  A Hugging Face hub cache snapshot (.../snapshots/REV/) holds symlinks into the repository's
  .../blobs/, which are part of the same download and allowed.
  """
  if (not isinstance(name, str) or not name or os.path.isabs(name)
      or os.path.normpath(name).split(os.sep)[0] == os.pardir):
    raise UnsafeCheckpointError(f'{what} is not a file name inside {directory}; refusing to read '
                                'it (a model directory reads only its own files).')
  path = os.path.join(directory, name)
  root = os.path.realpath(directory)
  allowed = [root]
  if os.path.basename(os.path.dirname(root)) == 'snapshots':
    allowed.append(os.path.join(os.path.dirname(os.path.dirname(root)), 'blobs'))
  resolved = os.path.realpath(path)
  if not any(os.path.commonpath([resolved, a]) == a for a in allowed):
    raise UnsafeCheckpointError(f'{what} resolves to {resolved}, outside {directory}; refusing '
                                'to read it (a model directory reads only its own files).')
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{what}: {path} does not exist; the model directory is '
                            'incomplete (download it again).')
  return path


def _read_safetensors(path):
  try:
    return safetensors.numpy.load_file(path)
  except safetensors.SafetensorError as e:  # Not a ValueError: callers would see a traceback.
    raise ValueError(f'{path} is not a readable safetensors file ({e}); it is truncated or '
                     'corrupt (download it again).') from e


def _read_torch(path):
  """A pytorch_model.bin as numpy; torch is needed only here."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(f'Reading {path} needs torch (pip install torch); model.safetensors '
                      'files need only safetensors.') from e
  import pickle  # pylint: disable=g-import-not-at-top
  try:
    # weights_only: torch's restricted unpickler, which builds tensors and plain containers only
    # and refuses any other object (a pickle can run code when it is loaded).
    loaded = torch.load(path, weights_only=True, map_location='cpu')
  except pickle.UnpicklingError as e:
    raise UnsafeCheckpointError(
        f'Refusing to load {path}: it holds Python objects other than tensors, and unpickling '
        f'them could run code ({str(e).splitlines()[0][:200]}). Convert it to '
        'model.safetensors with a trusted tool, or use a safetensors copy.') from e
  if not isinstance(loaded, dict) or not all(hasattr(v, 'numpy') for v in loaded.values()):
    raise UnsafeCheckpointError(f'{path} is not a state dict of tensors.')
  return {k: (v.float() if v.is_floating_point() else v).numpy() for k, v in loaded.items()}


def tokenizer_casing(hf_dir: str) -> dict:
  """{setting: value} of lowercasing and accent stripping that the HF tokenizer files state."""
  found = {}
  path = os.path.join(hf_dir, 'tokenizer_config.json')
  if os.path.isfile(path):
    with open(path, encoding='utf-8') as f:
      settings = json.load(f)
    for name in ('do_lower_case', 'strip_accents'):
      if settings.get(name) is not None:  # strip_accents None: follows lowercasing.
        found[f'tokenizer_config.json {name}'] = bool(settings[name])
  path = os.path.join(hf_dir, 'tokenizer.json')
  if os.path.isfile(path):
    with open(path, encoding='utf-8') as f:
      normalizer = json.load(f).get('normalizer') or {}
    steps = normalizer.get('normalizers', [normalizer])  # A Sequence, or one normalizer.
    for step in steps:
      if step.get('type') == 'BertNormalizer':
        found['tokenizer.json BertNormalizer.lowercase'] = bool(step.get('lowercase'))
        if step.get('strip_accents') is not None:
          found['tokenizer.json BertNormalizer.strip_accents'] = bool(step['strip_accents'])
      elif step.get('type') == 'Lowercase':
        found['tokenizer.json Lowercase'] = True
  return found


def check_tokenizer_casing(hf_dir: str, lowercase: bool) -> None:
  """Raises CasingMismatchError when the HF tokenizer's casing disagrees with `lowercase`.

  Our uncased tokenizer also strips accents and the cased one keeps them, so an explicit
  strip_accents must equal `lowercase` as well.
  """
  wrong = {k: v for k, v in tokenizer_casing(hf_dir).items() if v != lowercase}
  if wrong:
    said = ', '.join(f'{k}={v}' for k, v in wrong.items())
    raise CasingMismatchError(
        f'Tokenizer casing mismatch: {hf_dir} has {said} but config.data.lowercase={lowercase}; '
        'ids would differ from what the model was trained on.')
