"""A distillation run's teacher and the student made from it (config.distill, objectives/distill.py).

config.distill.teacher names the teacher as config.init_from names a source (a bert_jax
'WORKDIR', 'WORKDIR@STEP' or 'hf:DIR'); init_from.py reads it. Its architecture becomes
config.distill.teacher_model (and the student's vocab and position rows), its vocab the run's
unless data.vocab_file is set. Its encoder and MLM head are loaded whole under the `teacher`
scope. The student starts as DistilBERT's scripts/extract_distilbert.py makes it: the teacher's
word and position embeddings and their LayerNorm, the layers teacher_layers names (one per
student layer), and the MLM head. A student without a segment table (DistilBERT) gets the
teacher's segment row 0 folded into its position rows, where extract_distilbert.py drops the
table: every token of a single-segment row reads row 0, so the folded student computes what the
teacher's chosen layers compute on those rows, where the dropped one starts off by that row.
"""

import jax
import ml_collections
import numpy as np
from absl import logging

from bert_jax.interop import init_from
from bert_jax.interop import param_tree

InitFromError = init_from.InitFromError
TEACHER = 'teacher'
# Student sizes that must equal the teacher's: its layers are copied whole.
_SAME = ('hidden_size', 'num_heads', 'intermediate_size', 'vocab_size', 'embedding_size')


def _error(text: str) -> str:
  return text.replace('config.init_from', 'config.distill.teacher')


def teacher_layers(config) -> list[int]:
  """The teacher layer each student layer starts from: config.distill.teacher_layers, or (empty)
  num_layers indices spread evenly from the teacher's first to its last, rounded (12 -> 6:
  0, 2, 4, 7, 9, 11, extract_distilbert.py's). InitFromError for a list that does not fit."""
  student = config.model.num_layers
  depth = config.distill.teacher_model.num_layers
  text = str(config.distill.teacher_layers).strip()
  if not text:
    if student == 1:
      return [0]
    return [int(np.floor(i * (depth - 1) / (student - 1) + 0.5)) for i in range(student)]
  try:
    chosen = [int(item) for item in text.split(',')]
  except ValueError:
    raise InitFromError(f'config.distill.teacher_layers={text!r} is not a comma-separated list '
                        f'of layer indices (e.g. \'0,2,4\'); valid indices are 0 to '
                        f'{depth - 1}.') from None
  if len(chosen) != student:
    raise InitFromError(f'config.distill.teacher_layers={text!r} names {len(chosen)} layer(s) '
                        f'but the student has config.model.num_layers={student}: name one '
                        'teacher layer per student layer.')
  bad = [i for i in chosen if not 0 <= i < depth]
  if bad:
    raise InitFromError(f'config.distill.teacher_layers={text!r}: layer {bad[0]} is out of '
                        f'range; the teacher has {depth} layers, valid indices 0 to '
                        f'{depth - 1}.')
  return chosen


def check_student(config) -> None:
  """The student fits config.distill.teacher_model (InitFromError naming the value otherwise);
  the teacher, when named, exists; it is not combined with config.init_from."""
  d, m = config.distill, config.model
  t = d.teacher_model
  if config.init_from and d.teacher:
    raise InitFromError(f'config.init_from={config.init_from!r} with config.distill.teacher='
                        f'{d.teacher!r}: a distilled student starts from its teacher; set '
                        "config.init_from=''.")
  if t.causal:
    raise InitFromError('config.distill.teacher_model.causal=True: the teacher of a masked-LM '
                        'student must be bidirectional.')
  for key in _SAME:
    if m[key] != t[key]:
      raise InitFromError(
          f'config.model.{key}={m[key]}, but the teacher has {key}={t[key]} '
          '(config.distill.teacher_model): the student keeps its teacher\'s width, heads, '
          f'feed-forward and vocab; set config.model.{key}={t[key]}.')
  if m.num_layers > t.num_layers:
    raise InitFromError(f'config.model.num_layers={m.num_layers} is deeper than the teacher\'s '
                        f'{t.num_layers} layers; valid student depths are 1 to {t.num_layers}.')
  teacher_layers(config)
  if d.teacher:
    try:
      init_from.check_exists(d.teacher)
    except InitFromError as e:
      raise InitFromError(_error(str(e))) from e


def adopt_teacher(config) -> None:
  """A 'distill' run takes its teacher's architecture (config.distill.teacher_model), vocab
  size and position rows (config.model) and, unless data.vocab_file is set, vocab from
  config.distill.teacher; InitFromError when no teacher is named."""
  spec = config.distill.teacher
  if not spec:
    raise InitFromError(
        "config.objectives names 'distill' but config.distill.teacher is empty; name the "
        "teacher's weights: a bert_jax workdir ('WORKDIR' or 'WORKDIR@STEP') or 'hf:DIR'.")
  try:
    init_from.check_exists(spec)
    arch = init_from.source_architecture(spec)
    arch['gelu'] = init_from.source_gelu(spec)
  except InitFromError as e:
    raise InitFromError(_error(str(e))) from e
  vocab = None
  if not config.data.vocab_file:
    vocab = init_from.source_vocab(spec, init_from.tokenizer_kind(config))
    if vocab is None:
      raise InitFromError(f'config.distill.teacher={spec!r} has no vocab beside its weights; '
                          'the student reads its token ids: set config.data.vocab_file.')
  apply_teacher_shape(config, arch, vocab, spec)


def apply_teacher_shape(config, arch: dict, vocab_file: str | None, source: str) -> None:
  """Sets what a 'distill' run takes from its teacher: `arch` (architecture keys and gelu) into
  config.distill.teacher_model; the teacher's width, heads, feed-forward, embedding width, vocab
  size and position rows into config.model (the student's layers are copies of the teacher's);
  and `vocab_file` into data.vocab_file when that is unset. The sweep calls it with a teacher
  arm's config before that arm has trained; adopt_teacher with the teacher's checkpoint."""
  teacher = config.distill.teacher_model
  for key, value in arch.items():
    if key in teacher and teacher[key] != value:
      logging.info('distill: config.distill.teacher_model.%s = %s, from %s.', key, value, source)
      teacher[key] = type(teacher[key])(value)
  for key in (*_SAME, 'max_position_embeddings'):
    if config.model[key] != teacher[key]:
      logging.info('distill: config.model.%s = %s (was %s), the teacher\'s.', key, teacher[key],
                   config.model[key])
      config.model[key] = teacher[key]
  if not config.data.vocab_file and vocab_file:
    logging.info('distill: config.data.vocab_file = %s, the teacher\'s vocab.', vocab_file)
    config.data.vocab_file = vocab_file


def teacher_config(config) -> ml_collections.ConfigDict:
  """The run's config as the teacher's own pretraining config: its architecture, MLM only."""
  from bert_jax.objectives import distill  # pylint: disable=g-import-not-at-top
  run = distill.teacher_run_config(config)
  run.objectives = 'mlm'
  return run


def load_teacher(config, target) -> dict:
  """The teacher's encoder (no pooler) and MLM head from config.distill.teacher, as host arrays
  laid out as `target` (the fresh `teacher` subtree)."""
  spec = config.distill.teacher
  kind, path = init_from.parse(spec)
  if kind == 'workdir':
    params = init_from.workdir_params(path, init_from.parse_step(spec))
  elif kind == 'hf':
    from bert_jax.interop import hf  # pylint: disable=g-import-not-at-top
    try:
      state_dict, hf_config = init_from.read_source(kind, path)
      state_dict = _with_pooler(state_dict, config)
      params, report = hf.import_hf(state_dict, teacher_config(config), hf_config=hf_config)
    except (ValueError, OSError) as e:
      raise InitFromError(f'config.distill.teacher={spec!r}: {e}') from e
    logging.info('distill teacher %s: %s', spec, report.summary())
  else:
    raise InitFromError(f'config.distill.teacher={spec!r}: a teacher is a bert_jax workdir or '
                        'hf:DIR.')
  params = {'bert': {k: v for k, v in params['bert'].items() if k != 'pooler'},
            'predictions': params.get('predictions')}
  if params['predictions'] is None:
    raise InitFromError(f'config.distill.teacher={spec!r} has no MLM head (predictions): a '
                        'teacher needs its masked-LM distribution.')
  params = init_from.match_layer_layout(params, target)
  init_from.check_same_structure(params, target, spec)
  return jax.tree.map(lambda x, t: np.asarray(x, t.dtype), params, target)


def _with_pooler(state_dict, config):
  """An HF BertForMaskedLM has no pooler, which BERT's import table asks for: zeros stand in
  (the teacher pools nothing; load_teacher drops it)."""
  h = config.distill.teacher_model.hidden_size
  prefix = 'bert.' if any(k.startswith('bert.') for k in state_dict) else ''
  if (config.distill.teacher_model.name == 'bert' and f'{prefix}embeddings.word_embeddings.weight'
      in state_dict and f'{prefix}pooler.dense.weight' not in state_dict):
    state_dict = {**state_dict, f'{prefix}pooler.dense.weight': np.zeros((h, h), np.float32),
                  f'{prefix}pooler.dense.bias': np.zeros((h,), np.float32)}
  return state_dict


def student_from_teacher(teacher: dict, fresh: dict, layers: list[int]) -> dict:
  """The student's parameters (beside `teacher`) from the teacher's: embeddings (segment row 0
  folded into the positions where the student has no segment table), the chosen layers, the
  MLM head; what the teacher has no counterpart for (a BERT student's pooler, another objective's
  head) stays as `fresh`. Host arrays, both trees unscanned or both scanned."""
  flatten = param_tree.flatten
  scanned = 'layer' in fresh['bert']['encoder']
  source = flatten(teacher)
  student = flatten({k: v for k, v in fresh.items() if k != TEACHER})
  if scanned:
    source = param_tree.unstack_layers(source)
    student = param_tree.unstack_layers(student)
  out = {}
  for path, value in student.items():
    match = param_tree.LAYER.match(path)
    if match:
      path_in_teacher = f'bert/encoder/layer_{layers[int(match[1])]}/{match[2]}'
    else:
      path_in_teacher = path
    out[path] = source.get(path_in_teacher, value)
  segments = 'bert/embeddings/token_type_embeddings'
  if segments in source and segments not in student:
    positions = 'bert/embeddings/position_embeddings'
    out[positions] = source[positions] + source[segments][0]
  if scanned:
    out = param_tree.stack_layers(out, len(layers))
  out = {k: np.asarray(v, student_dtype(fresh, k)) for k, v in out.items()}
  return param_tree.unflatten(out)


def student_dtype(fresh, path):
  node = fresh
  for name in path.split('/'):
    node = node[name]
  return node.dtype


def initial_params(config, fresh) -> dict:
  """A distillation run's first parameters: the teacher loaded under `teacher`, the student
  made from it (student_from_teacher)."""
  fresh = jax.tree.map(np.asarray, jax.device_get(fresh))
  teacher = load_teacher(config, fresh[TEACHER])
  layers = teacher_layers(config)
  logging.info('distill: the student\'s %d layers start from the teacher\'s layers %s of %s.',
               len(layers), layers, config.distill.teacher)
  return {**student_from_teacher(teacher, fresh, layers), TEACHER: teacher}

