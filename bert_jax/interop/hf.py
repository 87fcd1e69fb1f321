"""Hugging Face <-> our parameters, for every family: import, export, file loading.

HF state dicts (BertForPreTraining / BertModel, RobertaForMaskedLM / RobertaModel,
AlbertForPreTraining / AlbertForMaskedLM / AlbertModel) differ from our tree (docs/ARCHITECTURE.md,
"Parameters") by a backbone prefix, `.weight` names, [out, in] Linear kernels and flat heads; every
key maps by one row of its family's table (models/<name>/hf.py: BERT's is TABLE), and any key no row
explains is an error, never a guess. config.model.name picks the family. The CLI and the Python
entry points are in convert.py.
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

from bert_jax import models
from bert_jax import objectives
from bert_jax.core import files
from bert_jax.interop import param_tree
from bert_jax.models import architecture
from bert_jax.models import hf_layout
from bert_jax.models import layers
from bert_jax.models.bert import hf as bert_hf
from bert_jax.objectives import pretraining

# BERT's (our path, HF key, transform) rows. `{n}` is the layer; ours is the unscanned name, which
# the scanned tree stacks along a leading axis as bert/encoder/layer/... Backbone keys are written
# with the `bert.` prefix of BertForPreTraining; BertModel checkpoints have them without it.
TABLE = bert_hf.TABLE
# Buffers, not parameters: older transformers saved them; they carry nothing to import.
IGNORED_KEYS = bert_hf.LAYOUT.ignored
# HF hidden_act -> our model.gelu ('erf' exact, 'tanh' approximation); export writes the first.
HF_GELU = hf_layout.HF_GELU
UnsupportedConfigError = hf_layout.UnsupportedConfigError
# Leaves whose first axis is the vocab: resized together by resize_vocab.
VOCAB_PATHS = ('bert/embeddings/word_embeddings', 'predictions/output_bias')
# Original TF names kept by old pytorch_model.bin files; from_pretrained renames them too.
_LEGACY_NAMES = ((re.compile(r'(LayerNorm)\.gamma$'), r'\1.weight'),
                 (re.compile(r'(LayerNorm)\.beta$'), r'\1.bias'))


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


class CasingMismatchError(ValueError):
  """A tokenizer's lowercasing disagrees with config.data.lowercase."""


@dataclasses.dataclass(frozen=True)
class Entry:
  """One HF key and the (unscanned) leaf of ours it maps to."""
  hf_key: str
  path: str
  transform: str
  # 'backbone', 'pooler' (a backbone part some head models lack) or the objective of the head
  # ('mlm', 'nsp', 'sop').
  group: str = 'backbone'


def entries(num_layers: int, prefix: str | None = None,
            layout: hf_layout.Layout = bert_hf.LAYOUT) -> list[Entry]:
  """The layout's table (BERT's by default) expanded over layers, with backbone keys under
  `prefix` (default the head models' 'bert.'; '' for BertModel)."""
  prefix = layout.prefix if prefix is None else prefix
  out = []
  for path, key, transform in layout.table:
    if key.startswith(layout.prefix):
      key = prefix + key[len(layout.prefix):]
    for n in range(num_layers) if '{n}' in path else [None]:
      out.append(Entry(key.replace('{n}', str(n)), path.replace('{n}', str(n)), transform,
                       layout.group(path)))
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
  vocab_rows_carried: int = 0  # Rows moved by token into another vocab (init_vocab_by_token).

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
    if self.vocab_rows_carried:
      lines.append(f'vocab by token: {self.vocab_rows_carried} rows from the same token, '
                   f'{self.vocab_rows_added} tokens new (the mean row)')
    elif self.vocab_rows_added or self.vocab_rows_removed:
      lines.append(f'vocab resized: {self.vocab_rows_added} rows added, '
                   f'{self.vocab_rows_removed} removed')
    return '\n'.join(lines)


def hf_config_to_model_overrides(hf_config: dict) -> dict:
  """HF config.json dict -> our config.model values, model.name among them for RoBERTa and
  ALBERT (a BERT config leaves the family as it is); UnsupportedConfigError on what we lack."""
  return hf_layout.for_hf_config(hf_config).to_overrides(hf_config)


def has_nsp(config) -> bool:
  """Whether the run's model has the NSP head (config.objectives names 'nsp')."""
  return 'nsp' in objectives.parse(config.objectives)


def model_to_hf_config(config) -> dict:
  """Our full config -> the HF config.json of its family's class (BERT: BertForPreTraining,
  BertForMaskedLM without NSP, BertLMHeadModel with causal attention; RobertaForMaskedLM;
  AlbertForPreTraining with SOP, else AlbertForMaskedLM)."""
  return hf_layout.for_config(config).to_hf_config(config)


def leaf_shapes(config) -> dict:
  """{unscanned path: shape} of every parameter of the run's model (config.model.name, the heads
  of config.objectives)."""
  name = config.model.get('name', 'bert')
  cfg = dataclasses.replace(models.get(name).config_from(config), scan_layers=False)
  run_objectives = objectives.resolve(config)
  model = pretraining.PretrainingModel(cfg, run_objectives.items, name)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                          pretraining.dummy_batch(1, 2, 1, objectives=run_objectives.items))
  # A frozen scope (a distillation teacher) is not the model's: never imported or exported.
  frozen = run_objectives.frozen_scopes
  flat = param_tree.flatten(nn.meta.unbox(shapes['params']))
  return {k: tuple(v.shape) for k, v in flat.items() if k.split('/')[0] not in frozen}


def _detect_layout(keys, layout: hf_layout.Layout = bert_hf.LAYOUT):
  """(layout name, backbone prefix, has heads) from the key names."""
  prefix = layout.prefix
  prefixed = any(k.startswith(prefix) for k in keys)
  bare = any(k.startswith(('embeddings.', 'encoder.', 'pooler.')) for k in keys)
  heads = any(k.startswith(layout.head_key_prefixes) for k in keys)
  head_text = ', '.join(p + '*' for p in layout.head_key_prefixes)
  reason = (f'both {prefix}* and unprefixed backbone keys' if prefixed and bare else
            f'no {layout.display} backbone keys' if not (prefixed or bare) else
            f'{head_text} heads next to an unprefixed backbone' if heads and not prefixed else '')
  if reason:
    head_class = layout.head_classes[0][0]
    raise CheckpointMismatchError('Unrecognised state dict', [
        f'expected {head_class} keys ({prefix}*, {head_text}) or {layout.base_class} keys '
        f'(embeddings.*, encoder.*, pooler.*) but found {reason}; first keys: '
        f'{sorted(keys)[:5]}'])
  if not prefixed:
    return layout.base_class, '', False
  if not heads:
    return f'{layout.base_class} ({prefix}-prefixed)', prefix, False
  name = next(c for c, p in layout.head_classes if any(k.startswith(p) for k in keys))
  return name, prefix, True


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
  family = hf_layout.for_hf_config(hf_config).family
  problems = []
  if family != config.model.get('name', 'bert'):
    problems.append(f'HF config model_type={hf_config.get("model_type", "bert")!r} is '
                    f'{family}\'s, but config.model.name={config.model.get("name", "bert")!r}')
  # The architecture (architecture.ARCHITECTURE_KEYS) but the family, compared above, and causal, which
  # only a decoder's config states; the vocab size last, unless it is being resized.
  checked = [key for key in architecture.ARCHITECTURE_KEYS
             if key not in ('name', 'causal', 'vocab_size')]
  if not resize_vocab:
    checked.append('vocab_size')
  return problems + [
      f'HF config {name}={overrides[name]} but config.model.{name}={config.model[name]}'
      for name in checked if name in overrides and overrides[name] != config.model[name]]


def _head_subtrees(shapes) -> list[str]:
  """Our model's head subtrees (everything beside the encoder's `bert/`), in tree order."""
  return list(dict.fromkeys(p.split('/')[0] for p in shapes if not p.startswith('bert/')))


def _plan(state_dict, config, hf_config, resize_vocab, report):
  """Validates everything first; returns (entries to load, our leaf shapes, checkpoint vocab)."""
  layout_of = hf_layout.for_config(config)
  layout, prefix, heads = _detect_layout(state_dict, layout_of)
  report.layout = layout
  shapes = leaf_shapes(config)
  table = entries(config.model.num_layers, prefix, layout_of)
  problems = [] if hf_config is None else _config_problems(hf_config, config, resize_vocab)
  word_key = prefix + 'embeddings.word_embeddings.weight'
  vocab = config.model.vocab_size
  if word_key in state_dict and np.ndim(state_dict[word_key]) == 2:
    vocab = state_dict[word_key].shape[0]
    if vocab != config.model.vocab_size and not resize_vocab:
      problems.append(f'vocab size: the checkpoint has {vocab} rows but config.model.vocab_size='
                      f'{config.model.vocab_size}; pass resize_vocab=True to truncate or add rows')
  load, known, filled = [], set(), set()
  for e in table:
    known.add(e.hf_key)
    if e.group not in ('backbone', 'pooler') and not heads:
      continue
    if e.path not in shapes:  # A head of an objective this run does not train.
      if e.hf_key in state_dict and e.transform != 'tied':
        report.skipped.append(f'{e.hf_key}: config.objectives has no {e.group}, the model has no '
                              f'{e.group.upper()} head')
      continue
    if e.hf_key not in state_dict:
      if e.transform != 'tied' and e.group != 'pooler':
        hint = (" (an MLM-only checkpoint? set config.objectives='mlm')"
                if e.group not in ('backbone', 'mlm') else '')
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
      filled.add(e.path)
  for key in sorted(state_dict):
    if layout_of.ignored.match(key):
      report.ignored.append(key)
    elif key not in known:
      problems.append(f'unexpected key {key} {tuple(np.shape(state_dict[key]))}')
  problems += _tied_problems(state_dict, [e for e in load if e.transform == 'tied'], table, report)
  if problems:
    raise CheckpointMismatchError(f'Checkpoint ({layout}) does not fit the model', problems)
  report.missing_heads = [h for h in _head_subtrees(shapes)
                          if not any(p.startswith(h + '/') for p in filled)]
  if any(p.startswith('bert/pooler/') for p in shapes) and not any(
      p.startswith('bert/pooler/') for p in filled):
    report.missing_heads.append('bert/pooler')
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
              resize_vocab: bool = False, seed: int = 0, vocab_rows=None):
  """HF state dict -> (params, ImportReport): float32 numpy in our layout, scanned per config.

  The family is config.model.name's. Raises CheckpointMismatchError listing every missing,
  unexpected and misshapen key (and, when hf_config is given, every architecture field that
  disagrees with config.model) before building. Backbone-only checkpoints (BertModel, ...) have
  no heads, and the masked-LM classes of BERT, RoBERTa and ALBERT no pooler: those subtrees are
  left out and named in report.missing_heads, as are heads of objectives the checkpoint has none
  for; merge_missing fills them.
  """
  report = ImportReport(layout='')
  state_dict = _canonical_keys(state_dict, report)
  load, shapes, vocab = _plan(state_dict, config, hf_config,
                              resize_vocab or vocab_rows is not None, report)
  flat = {}
  for e in load:
    shape = list(shapes[e.path])
    if e.path in VOCAB_PATHS:
      shape[0] = vocab
    value = np.asarray(state_dict[e.hf_key], dtype=np.float32)
    flat[e.path] = np.ascontiguousarray(_to_ours(e.transform, value, tuple(shape)))
  report.loaded = len(load)
  if vocab_rows is not None:
    _carry_vocab_rows(flat, np.asarray(vocab_rows), report)
  elif vocab != config.model.vocab_size:
    _resize_vocab(flat, config, seed, report)
  if config.model.scan_layers:
    flat = param_tree.stack_layers(flat, config.model.num_layers)
  return param_tree.unflatten(flat), report


def _carry_vocab_rows(flat, rows, report):
  """The vocab leaves in the run's vocab: row i is the source's row rows[i], or with rows[i] = -1
  (a token the source lacks) the mean of the source's rows."""
  rows = np.where(rows < len(flat['bert/embeddings/word_embeddings']), rows, -1)  # Rows it has.
  report.vocab_rows_carried = int(np.sum(rows >= 0))
  report.vocab_rows_added = int(np.sum(rows < 0))
  report.vocab_rows_removed = 0
  for path in VOCAB_PATHS:
    if path not in flat:  # A BertModel checkpoint has no output bias.
      continue
    source = flat[path]
    mean = source.mean(axis=0, keepdims=True)
    flat[path] = np.where((rows >= 0).reshape((-1,) + (1,) * (source.ndim - 1)),
                          source[np.maximum(rows, 0)], mean).astype(np.float32)


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
  model = pretraining.build(config)
  batch = {k: np.zeros(v.shape, v.dtype)
           for k, v in pretraining.dummy_batch(1, 2, 1, objectives=model.objectives).items()}
  variables = jax.jit(model.init)(jax.random.PRNGKey(seed), batch)
  return jax.tree.map(np.asarray, nn.meta.unbox(variables['params']))


def merge_missing(params, fresh_params, config=None):
  """Fills the subtrees absent from `params` that import_hf may leave out from `fresh_params`:
  heads (anything beside the encoder's `bert/`), and for a family whose head models drop the
  pooler (BERT's masked LM, which `config=None` means, RoBERTa's, ALBERT's) `bert/pooler`.
  Anything else missing is an error."""
  layout = bert_hf.LAYOUT if config is None else hf_layout.for_config(config)
  fresh = param_tree.flatten(nn.meta.unbox(fresh_params))
  flat = param_tree.flatten(params)
  fillable = 'heads' + (' and bert/pooler' if layout.optional_pooler else '')
  problems = [f'{path} is not a parameter of the model' for path in flat if path not in fresh]
  for path, value in fresh.items():
    if path not in flat:
      if not path.startswith('bert/') or (layout.optional_pooler
                                          and path.startswith('bert/pooler/')):
        flat[path] = np.asarray(value, np.float32)
      else:
        problems.append(f'missing {path}; only {fillable} may come from a fresh init')
    elif np.shape(flat[path]) != np.shape(value):
      problems.append(f'{path}: shape {np.shape(flat[path])} but the model has {np.shape(value)}')
  if problems:
    raise CheckpointMismatchError('Cannot merge the parameters', problems)
  return param_tree.unflatten(flat)


def export_hf(params, config, out_dir: str) -> list[str]:
  """Writes out_dir/config.json and model.safetensors (torch layout, float32); returns the keys.

  The class is config.model.name's family's (model_to_hf_config). The tied decoder weight and
  bias are written too, so any transformers version loads the MLM head without missing keys.
  BERT without NSP (no 'nsp' in config.objectives) has no NSP head: config.json names
  BertForMaskedLM, which loads cleanly (it drops the pooler, which nothing trained);
  BertForPreTraining would randomly initialise cls.seq_relationship. A causal BERT
  (config.model.causal, the clm objective) is written as a decoder, BertLMHeadModel. RoBERTa
  exports as RobertaForMaskedLM and ALBERT without SOP as AlbertForMaskedLM, both without the
  pooler, as those classes hold none; a head of ours the class lacks is left out, with a warning.
  """
  frozen = objectives.resolve(config).frozen_scopes  # A distillation teacher is not exported.
  flat = {k: np.asarray(v, np.float32)
          for k, v in param_tree.flatten(nn.meta.unbox(params)).items()
          if k.split('/')[0] not in frozen}
  if 'rtd' in objectives.parse(config.objectives):
    return _export_electra(flat, config, out_dir)
  shapes = leaf_shapes(config)
  # What served pretraining only (DeBERTa's mask decoder's position table) no class holds.
  dropped = models.pretraining_only_paths(config.model)
  flat = {k: v for k, v in flat.items() if k not in dropped}
  shapes = {k: v for k, v in shapes.items() if k not in dropped}
  note = hf_layout.for_config(config).export_note(config)
  if note:
    logging.warning(note)
  return _export_flat(flat, config, out_dir, shapes)


def export_dirs(config, out_dir: str) -> list[str]:
  """The HF directories export_hf writes for config: out_dir, or for ELECTRA's 'rtd'
  out_dir/discriminator (ElectraForPreTraining) and out_dir/generator (ElectraForMaskedLM)."""
  if 'rtd' in objectives.parse(config.objectives):
    return [os.path.join(out_dir, 'discriminator'), os.path.join(out_dir, 'generator')]
  return [out_dir]


def _export_electra(flat, config, out_dir) -> list[str]:
  """A replaced-token-detection run's parameters as two HF directories (export_dirs): the
  discriminator (its tables materialised under model.embedding_sharing='gdes';
  ElectraForPreTraining, or DeBERTa's backbone as DebertaV2Model) and, re-rooted with a copy of
  the embeddings it reads, the generator (ElectraForMaskedLM, DebertaV2ForMaskedLM)."""
  from bert_jax.models import electra  # pylint: disable=g-import-not-at-top
  from bert_jax.models import sharing  # pylint: disable=g-import-not-at-top
  shapes = leaf_shapes(config)
  keep = ('bert/', 'discriminator_predictions/')
  generator_trees = ('generator/', 'generator_predictions/')
  unexpected = [k for k in flat if not k.startswith(keep + generator_trees)]
  if unexpected:
    raise CheckpointMismatchError('Parameters do not fit config.model',
                                  [f'unexpected {k}' for k in unexpected])
  discriminator, generator = export_dirs(config, out_dir)
  # Under gradient-disentangled sharing the discriminator's tables are the generator's + deltas.
  disc = {k: v for k, v in sharing.discriminator_params(flat).items() if k.startswith(keep)}
  # transformers has ElectraForPreTraining; for another family's discriminator (DeBERTa-v3's) no
  # class holds the RTD head, so the backbone is written as the family's base model.
  layout = hf_layout.for_config(config)
  keys = _export_flat(disc, config, discriminator,
                      {k: v for k, v in shapes.items()
                       if k.startswith(keep) and not sharing.is_discriminator_embedding(k)},
                      architecture=None if layout.family == 'electra' else layout.base_class)
  gen_config = electra.generator_run_config(config)
  gen = electra.generator_params(flat)
  keys += _export_flat(gen, gen_config, generator, leaf_shapes(gen_config), pooler=False)
  return keys


def _export_flat(flat, config, out_dir, shapes, pooler=True, architecture=None) -> list[str]:
  """export_hf on flattened parameters; `shapes` those the model has (leaf_shapes), the pooler
  optional where pooler=False (an ELECTRA generator has none); `architecture` the class
  config.json names instead of the layout's."""
  layout = hf_layout.for_config(config)
  hf_config = model_to_hf_config(config)
  if architecture:
    hf_config['architectures'] = [architecture]
  if config.model.scan_layers:
    flat = param_tree.unstack_layers(flat)
  if not pooler:
    shapes = {k: v for k, v in shapes.items() if not k.startswith('bert/pooler/')}
  problems = [f'missing {k}' for k in shapes if k not in flat]
  problems += [f'unexpected {k}' for k in flat if k not in shapes]
  problems += [f'wrong shape for {k}: expected {shapes[k]}, got {v.shape}'
               for k, v in flat.items() if k in shapes and v.shape != shapes[k]]
  if problems:
    raise CheckpointMismatchError('Parameters do not fit config.model', problems)
  table = [e for e in entries(config.model.num_layers, layout=layout) if e.path in flat
           and (e.group != 'pooler' or layout.exports_pooler(config))
           and e.hf_key not in layout.not_exported]
  if architecture == layout.base_class:  # The backbone alone: no head's keys (a tied decoder).
    table = [e for e in table
             if not e.hf_key.startswith(tuple(prefix for _, prefix in layout.head_classes))]
  tensors = {e.hf_key: np.ascontiguousarray(_to_hf(e.transform, flat[e.path])) for e in table}
  dropped = [h for h in _head_subtrees(flat) if h not in layout.heads]
  if dropped:
    logging.warning('%s has no head for %s: not exported.', hf_config['architectures'][0],
                    dropped)
  if layout.family == 'bert' and not has_nsp(config) and not config.model.get('causal', False):
    logging.warning("config.objectives has no 'nsp': no NSP head is exported. BertForMaskedLM "
                    'loads the checkpoint fully; BertForPreTraining would randomly initialise '
                    'cls.seq_relationship.')
  os.makedirs(out_dir, exist_ok=True)
  # transformers reads the 'pt' format tag to know the layout is torch's.
  safetensors.numpy.save_file(tensors, os.path.join(out_dir, 'model.safetensors'),
                              metadata={'format': 'pt'})
  with open(os.path.join(out_dir, 'config.json'), 'w', encoding='utf-8') as f:
    json.dump(hf_config, f, indent=2, sort_keys=True)
    f.write('\n')
  return sorted(tensors)


# Special tokens of each kind's transformers tokenizer, in its tokenizer_config.json.
_SPECIAL_SETTINGS = {
    'wordpiece': {'unk_token': '[UNK]', 'sep_token': '[SEP]', 'pad_token': '[PAD]',
                  'cls_token': '[CLS]', 'mask_token': '[MASK]'},
    'bpe': {'bos_token': '<s>', 'eos_token': '</s>', 'cls_token': '<s>', 'sep_token': '</s>',
            'unk_token': '<unk>', 'pad_token': '<pad>', 'mask_token': '<mask>'},
    'sentencepiece': {'bos_token': '[CLS]', 'eos_token': '[SEP]', 'cls_token': '[CLS]',
                      'sep_token': '[SEP]', 'unk_token': '<unk>', 'pad_token': '<pad>',
                      'mask_token': '[MASK]'},
}
_SPECIAL_SETTINGS['sentencepiece_fairseq'] = _SPECIAL_SETTINGS['bpe']  # XLM-R's are RoBERTa's.


def export_tokenizer(vocab_file: str, lowercase: bool, out_dir: str, max_length: int,
                     kind: str = 'wordpiece') -> None:
  """Writes the tokenizer files transformers' AutoTokenizer loads and encodes with as ours do,
  with a tokenizer_config.json whose casing matches training.

  WordPiece: vocab.txt (BertTokenizer). Byte-level BPE: vocab.json, merges.txt and tokenizer.json
  (RobertaTokenizer; lowercased, the tokenizer.json as it is, since RobertaTokenizer never
  lowercases). SentencePiece: spiece.model (AlbertTokenizer, accents kept where case is).
  SentencePiece with fairseq's ids: sentencepiece.bpe.model (XLMRobertaTokenizer, which never
  lowercases: a lowercased vocab writes no tokenizer files, with a warning).
  """
  if kind == 'sentencepiece_fairseq' and lowercase:
    logging.warning("A lowercased 'sentencepiece_fairseq' vocab has no transformers tokenizer "
                    '(XLMRobertaTokenizer keeps case): %s gets no tokenizer files; lowercase '
                    'text before encoding it with the model in %s.', out_dir, vocab_file)
    return
  os.makedirs(out_dir, exist_ok=True)
  settings = {'model_max_length': max_length, **_SPECIAL_SETTINGS[kind]}
  if kind == 'wordpiece':
    shutil.copyfile(os.path.expanduser(vocab_file), os.path.join(out_dir, 'vocab.txt'))
    settings.update(tokenizer_class='BertTokenizer', do_lower_case=lowercase, strip_accents=None,
                    tokenize_chinese_chars=True)
  else:
    from bert_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
    tokenizer = tokenizer_lib.load_tokenizer(kind, vocab_file, lowercase)
    for name, path in tokenizer.files().items():
      shutil.copyfile(path, os.path.join(out_dir, name))
    if kind == 'bpe':
      with open(os.path.join(out_dir, 'tokenizer.json'), 'w', encoding='utf-8') as f:
        f.write(tokenizer.tokenizer_json())
      settings.update(tokenizer_class='PreTrainedTokenizerFast' if lowercase
                      else 'RobertaTokenizer', add_prefix_space=False, trim_offsets=True,
                      errors='replace')
    elif kind == 'sentencepiece_fairseq':
      settings.update(tokenizer_class='XLMRobertaTokenizer')
    else:
      # DeBERTa's too: its vocab is trained and its text prepared as ALBERT's, which
      # DebertaV2Tokenizer does not reproduce (it keeps `` and '' and, lowercased, accents).
      settings.update(tokenizer_class='AlbertTokenizer', do_lower_case=lowercase,
                      keep_accents=not lowercase, remove_space=True)
  with open(os.path.join(out_dir, 'tokenizer_config.json'), 'w', encoding='utf-8') as f:
    json.dump(settings, f, indent=2)
    f.write('\n')


def split_classifier(state_dict: dict, layout: hf_layout.Layout) -> tuple[dict, dict]:
  """(the state dict less the keys of the family's sequence-classification head, those keys):
  import_hf reads the first (the backbone), import_classifier the second."""
  keys = {key for _, key, _ in layout.classifier}
  return ({k: v for k, v in state_dict.items() if k not in keys},
          {k: v for k, v in state_dict.items() if k in keys})


def import_classifier(head_state: dict, layout: hf_layout.Layout) -> dict:
  """{our fine-tuning model's path ('classifier/kernel', RoBERTa's 'bert/pooler/...'): float32
  array} of the sequence-classification head keys in `head_state`."""
  flat = {}
  for path, key, transform in layout.classifier:
    if key in head_state:
      value = np.asarray(head_state[key], np.float32)
      flat[path] = np.ascontiguousarray(_to_ours(transform, value, _shape_of(transform,
                                                                            value.shape)))
  return flat


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
    # Confined as the index's shards are: a symlink out of the directory is not its weights.
    path = model_file(path, found[0], os.path.join(path, found[0]))
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
    hf_config = files.read_json_object(model_file(directory, 'config.json', config_path))
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
