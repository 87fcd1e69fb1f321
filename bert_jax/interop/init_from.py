"""Initial weights from elsewhere: `--config.init_from=hf:DIR | tf:PREFIX | WORKDIR[@STEP]`.

The weights replace the fresh parameters; the optimizer starts fresh and the step is 0. The
model's shape is taken from the source, so `configs/base.py` can start from any BERT checkpoint.
A workdir gives its newest checkpoint, or with @STEP that step's (for scores against pretraining
steps); either is checked against the integrity record written at save. A workdir may be gs://
(hf: and tf: sources are local). The family (model.name; an HF config.json's model_type) comes
with the shape.
"""

import json
import os
import re

import jax
import numpy as np
from absl import logging

from bert_jax.models import architecture
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.interop import param_tree
from bert_jax.core import files
from bert_jax.core import checkpoint

ARCHITECTURE_KEYS = architecture.ARCHITECTURE_KEYS  # What init_from adopts from its source.


def _unrolled_if_modern(architecture: dict) -> dict:
  """A modern encoder adopted runs its layers unrolled (model.scan_layers=False, its recipe's:
  the fastest on GPUs), whatever the config that adopts it had (BERT's configs scan)."""
  if architecture.get('name') == 'modernbert':
    return {**architecture, 'scan_layers': False}
  return architecture


class InitFromError(ValueError):
  """config.init_from names something that cannot be loaded."""


def parse(spec: str) -> tuple[str, str]:
  """'hf:DIR' -> ('hf', DIR); 'tf:PREFIX' -> ('tf', PREFIX); 'WORKDIR[@STEP]' -> ('workdir',
  WORKDIR) (parse_step gives STEP).

  Local paths come back absolute (relative ones are taken from the current directory), since
  orbax restores only from absolute paths.
  """
  rest, step = _split_step(spec)
  kind, sep, path = rest.partition(':')
  if not (sep and kind in ('hf', 'tf')):
    kind, path = 'workdir', rest
  elif step is not None:
    raise InitFromError(
        f'config.init_from={spec!r}: @{step} names a checkpoint step, which only a bert_jax '
        f'workdir has (WORKDIR@STEP); {kind}:{"DIR" if kind == "hf" else "PREFIX"} holds one set '
        f'of weights: drop @{step}.')
  return kind, _absolute(path)


def parse_step(spec: str) -> int | None:
  """STEP of 'WORKDIR@STEP'; None when the spec names no step (a workdir's newest checkpoint)."""
  parse(spec)  # Refuses a step on hf: and tf: sources.
  return _split_step(spec)[1]


def _split_step(spec: str) -> tuple[str, int | None]:
  """'PATH@2000' -> ('PATH', 2000); a spec without a trailing @ and digits -> (spec, None)."""
  match = re.fullmatch(r'(.+)@([0-9]+)', spec)
  return (match[1], int(match[2])) if match else (spec, None)


def _absolute(path: str) -> str:
  """`path` with ~ expanded, made absolute; a URL (gs://...) is left as it is."""
  if '://' in path or not path:
    return path
  return os.path.abspath(os.path.expanduser(path))


def check_exists(spec: str) -> None:
  """Fails before anything compiles when the source is not there."""
  kind, path = parse(spec)
  if kind == 'hf' and not os.path.isdir(path):
    raise InitFromError(f'config.init_from={spec!r}: {path!r} is not a directory; hf:DIR names '
                        'a HuggingFace model directory (config.json + model.safetensors).')
  if kind == 'tf' and not os.path.isfile(path + '.index'):
    raise InitFromError(f'config.init_from={spec!r}: {path + ".index"!r} does not exist; '
                        'tf:PREFIX names an original BERT checkpoint (PREFIX.index, '
                        'PREFIX.data-*, bert_config.json beside it).')
  if kind == 'workdir':
    steps = checkpoint.checkpoint_steps(path)
    if not steps:
      raise InitFromError(
          f'config.init_from={spec!r} is neither hf:DIR, tf:PREFIX nor a bert_jax workdir with '
          'checkpoints' + (' (a step is named as WORKDIR@2000)' if '@' in spec else '') + '.')
    step = parse_step(spec)
    if step is not None and step not in steps:
      raise InitFromError(f'config.init_from={spec!r}: ' + _missing_step(path, step, steps))


def _missing_step(workdir: str, step: int, steps: list[int],
                  name_step: str = 'WORKDIR@STEP') -> str:
  return (f'{os.path.join(workdir, "checkpoints")} has no checkpoint of step {step}; it has '
          f'steps {", ".join(map(str, steps))} (a run keeps its newest '
          f'train.keep_checkpoints). Name one of them as {name_step}.')


def _config_json(folder: str) -> dict:
  """The config.json of a workdir (our config) or an HF directory (transformers' config);
  InitFromError naming the file when it is not a JSON object."""
  try:
    return files.read_json_object(os.path.join(folder, 'config.json'))
  except ValueError as e:
    raise InitFromError(f'{e}; it cannot say what model the directory holds.') from e


def workdir_model(workdir: str) -> dict:
  """config.model of a bert_jax workdir's run, as its config.json holds it."""
  return _config_json(workdir)['model']


def source_architecture(spec: str) -> dict:
  """config.model values of the source checkpoint."""
  kind, path = parse(spec)
  if kind == 'workdir':
    model = _config_json(path)['model']
    return _unrolled_if_modern(
        {k: model[k] if k in model else architecture.SOURCE_DEFAULTS[k] for k in ARCHITECTURE_KEYS})
  from bert_jax.interop import hf  # pylint: disable=g-import-not-at-top
  if kind == 'hf':
    has_config = os.path.isfile(os.path.join(path, 'config.json'))
    hf_config = _config_json(path) if has_config else None
  else:
    from bert_jax.interop import tf_checkpoint  # pylint: disable=g-import-not-at-top
    config_path = os.path.join(os.path.dirname(path), 'bert_config.json')
    if not os.path.isfile(config_path):
      raise InitFromError(f'config.init_from={spec!r}: {config_path!r} does not exist.')
    with open(config_path, encoding='utf-8') as f:
      hf_config = tf_checkpoint.tf_config_to_hf_config(json.load(f))
  if hf_config is None:
    raise InitFromError(f'config.init_from={spec!r}: no config.json next to the weights.')
  try:
    overrides = hf.hf_config_to_model_overrides(hf_config)
  except ValueError as e:
    raise InitFromError(f'config.init_from={spec!r}: {e}') from e
  overrides = {**{k: v for k, v in architecture.SOURCE_DEFAULTS.items() if k != 'causal'}, **overrides}
  return _unrolled_if_modern({k: overrides[k] for k in ARCHITECTURE_KEYS if k in overrides})


def source_vocab(spec: str, tokenizer: str = 'wordpiece') -> str | None:
  """The vocab that belongs to the source's weights, when it has one: vocab.txt (WordPiece),
  vocab.json (byte-level BPE, merges.txt beside it) or spiece.model (SentencePiece)."""
  kind, path = parse(spec)
  folder = os.path.dirname(path) if kind == 'tf' else path
  candidate = os.path.join(folder, _vocab_name(tokenizer))
  return candidate if files.isfile(candidate) else None


def _vocab_name(tokenizer: str) -> str:
  """The file beside a checkpoint's weights that config.data.vocab_file names for `tokenizer`."""
  return tokenizer_lib.KEPT_FILES.get(tokenizer, tokenizer_lib.KEPT_FILES['wordpiece'])[0]


def source_tokenizer(spec: str) -> tuple[str, str]:
  """(config.data.tokenizer of the source's vocab, where that comes from): a workdir's recorded
  config, an HF config.json's model_type (its family's), WordPiece for tf:."""
  kind, path = parse(spec)
  if kind == 'workdir':
    data = _config_json(path).get('data', {})
    return data.get('tokenizer') or 'wordpiece', f'{os.path.join(path, "config.json")} data.tokenizer'
  if kind == 'tf':
    return 'wordpiece', 'an original BERT checkpoint'
  from bert_jax.models import hf_layout  # pylint: disable=g-import-not-at-top
  config_path = os.path.join(path, 'config.json')
  model_type = _config_json(path).get('model_type', 'bert')
  try:
    layout = hf_layout.for_hf_config({'model_type': model_type})
  except hf_layout.UnsupportedConfigError as e:
    raise InitFromError(f'config.init_from={spec!r}: {e}') from e
  return layout.tokenizer, f'{config_path} model_type={model_type!r}'


# The casing of a BPE or SentencePiece vocab whose HF directory states none: RobertaTokenizer and
# XLMRobertaTokenizer keep case, AlbertTokenizer lowercases (do_lower_case=True).
_FAMILY_CASING = {'bpe': False, 'sentencepiece': True, 'sentencepiece_fairseq': False}


def source_lowercase(spec: str, tokenizer: str) -> bool:
  """Whether the source's `tokenizer` vocab lowercases: a workdir's data.lowercase, an HF
  directory's tokenizer files, else the family's (_FAMILY_CASING)."""
  kind, path = parse(spec)
  if kind == 'workdir':
    return bool(_config_json(path).get('data', {}).get('lowercase', True))
  from bert_jax.interop import hf  # pylint: disable=g-import-not-at-top
  stated = set(hf.tokenizer_casing(path).values()) if kind == 'hf' else set()
  return stated.pop() if len(stated) == 1 else _FAMILY_CASING[tokenizer]


def adopt_tokenizer(config) -> None:
  """Fine-tuning: config.data.tokenizer '' becomes the source's kind; a kind that disagrees with
  the source is an InitFromError naming both. A BPE or SentencePiece vocab brings its casing
  (data.lowercase), which belongs to it as the ids do."""
  if config.get('mode') != 'finetune':
    return
  source, where = source_tokenizer(config.init_from)
  given = config.data.get('tokenizer', '')
  if given and given != source:
    raise InitFromError(
        f'config.data.tokenizer={given!r}, but config.init_from={config.init_from!r} was '
        f'trained with {source!r} ({where}): its token ids mean {source} pieces. Leave '
        f"data.tokenizer unset ('') to take the source's, or set it to {source!r}.")
  if not given:
    logging.info('init_from: config.data.tokenizer = %s, from %s.', source, where)
    config.data.tokenizer = source
  if source in _FAMILY_CASING:
    lowercase = source_lowercase(config.init_from, source)
    if lowercase != config.data.lowercase:
      logging.warning('init_from: config.data.lowercase = %s (was %s): the %s vocab of %s.',
                      lowercase, config.data.lowercase, source, config.init_from)
      config.data.lowercase = lowercase


def source_gelu(spec: str) -> str:
  """config.model.gelu of the source: a workdir's, or an HF config.json's hidden_act ('erf' for
  'gelu', 'tanh' for 'gelu_new'); 'erf' for tf: (the original BERT's hidden_act 'gelu')."""
  kind, path = parse(spec)
  if kind == 'workdir':
    return _config_json(path)['model'].get('gelu', 'erf')
  if kind == 'tf':
    return 'erf'
  from bert_jax.interop import hf  # pylint: disable=g-import-not-at-top
  try:
    return hf.hf_config_to_model_overrides(_config_json(path)).get('gelu', 'erf')
  except ValueError as e:
    raise InitFromError(f'config.init_from={spec!r}: {e}') from e


def adopt_gelu(config) -> None:
  """Fine-tuning a RoBERTa or ALBERT source computes the GELU its weights were trained with
  (ALBERT's is the tanh one). BERT fine-tuning keeps config.model.gelu."""
  if config.get('mode') != 'finetune' or config.model.get('name', 'bert') == 'bert':
    return
  gelu = source_gelu(config.init_from)
  if gelu != config.model.gelu:
    logging.info('init_from: config.model.gelu = %s (was %s), from the checkpoint.', gelu,
                 config.model.gelu)
    config.model.gelu = gelu


def adopt_source(config) -> None:
  """Takes the model's shape (and, unless given, the vocab; in fine-tuning the tokenizer's kind)
  from the source checkpoint. A vocab given (config.data.vocab_file) must be the source's, or
  keep its tokens' ids (one that extends it), or carry the rows by token
  (config.init_vocab_by_token): InitFromError otherwise, since the source's rows would be read
  as other tokens. With init_resize_vocab or init_vocab_by_token, model.vocab_size is the
  config's (by token: the new vocab's size), not the source's."""
  by_token = config.get('init_vocab_by_token', False)
  if by_token and config.get('init_resize_vocab', False):
    raise InitFromError('config.init_vocab_by_token=True and config.init_resize_vocab=True: '
                        'the rows move either by token or by id; set one of them.')
  kept = ('vocab_size',) if by_token or config.get('init_resize_vocab', False) else ()
  for key, value in source_architecture(config.init_from).items():
    if key in kept:
      continue
    if config.model[key] != value:
      logging.info('init_from: config.model.%s = %s (was %s), from the checkpoint.', key, value,
                   config.model[key])
      config.model[key] = type(config.model[key])(value)
  adopt_gelu(config)
  adopt_tokenizer(config)
  kind, path = parse(config.init_from)
  if kind == 'hf':
    from bert_jax.interop import hf  # pylint: disable=g-import-not-at-top
    try:
      hf.check_tokenizer_casing(path, config.data.lowercase)
    except ValueError as e:
      raise InitFromError(f'config.init_from={config.init_from!r}: {e}') from e
  if not config.data.vocab_file:
    tokenizer = tokenizer_kind(config)
    vocab = source_vocab(config.init_from, tokenizer)
    if vocab is None:
      raise InitFromError(
          f'config.init_from={config.init_from!r} has no '
          f'{_vocab_name(tokenizer)} beside its weights; its token ids need '
          'their own vocab: set config.data.vocab_file.')
    logging.info('init_from: config.data.vocab_file = %s, the checkpoint\'s vocab.', vocab)
    config.data.vocab_file = vocab
  _check_vocab(config, kind, by_token)


def tokenizer_kind(config) -> str:
  """config.data.tokenizer, WordPiece where a config leaves it empty."""
  return config.data.get('tokenizer') or 'wordpiece'


def vocab_tokens(config, vocab_file: str) -> list[str]:
  """The tokens of `vocab_file` by id, read with the run's tokenizer kind and casing."""
  tokenizer = tokenizer_lib.load_tokenizer(tokenizer_kind(config),
                                           vocab_file, config.data.lowercase)
  return [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]


def _check_vocab(config, kind: str, by_token: bool) -> None:
  """config.data.vocab_file against the source's vocab: the same tokens at the same ids, or
  carried by token (model.vocab_size then the new vocab's size)."""
  tokenizer = tokenizer_kind(config)
  source = source_vocab(config.init_from, tokenizer)
  if by_token and (kind == 'workdir' or source is None):
    raise InitFromError(
        f'config.init_vocab_by_token=True needs the source\'s vocab beside its weights '
        f'({_vocab_name(tokenizer)} in an hf: directory or beside a tf: checkpoint); '
        f'config.init_from={config.init_from!r} has none'
        + (' (export the workdir first: python -m bert_jax.convert export).'
           if kind == 'workdir' else '.'))
  if source is None or (not by_token
                        and os.path.abspath(source) == os.path.abspath(config.data.vocab_file)):
    return
  old, new = vocab_tokens(config, source), vocab_tokens(config, config.data.vocab_file)
  if by_token:  # Its size is the new vocab's, the source's own included.
    shared = len(set(new) & set(old))
    logging.info('init_from: config.model.vocab_size = %d (was %d), the new vocab\'s: %d of its '
                 'tokens take the checkpoint\'s rows of the same token, %d their mean.',
                 len(new), config.model.vocab_size, shared, len(new) - shared)
    config.model.vocab_size = len(new)
    return
  moved = sum(1 for i, token in enumerate(new) if i >= len(old) or old[i] != token)
  if (all(old[i] == new[i] for i in range(min(len(old), len(new))))
      and len(new) > config.model.vocab_size and not config.get('init_resize_vocab', False)):
    raise InitFromError(
        f'config.data.vocab_file={config.data.vocab_file!r} extends the vocab of '
        f'config.init_from={config.init_from!r} by {len(new) - len(old)} tokens, beyond its '
        f'{config.model.vocab_size} rows. Set config.init_resize_vocab=True and '
        f'config.model.vocab_size to at least {len(new)} (the new rows start at the model\'s '
        'init), or config.init_vocab_by_token=True (they start at the mean row).')
  if any(old[i] != new[i] for i in range(min(len(old), len(new)))):
    raise InitFromError(
        f'config.data.vocab_file={config.data.vocab_file!r} is not the vocab of '
        f'config.init_from={config.init_from!r}: {moved} of its {len(new)} tokens have another '
        f'id there or none, so the checkpoint\'s rows would be read as other tokens. Set '
        'config.init_vocab_by_token=True to give each token the checkpoint\'s rows of the same '
        'token (a token it lacks their mean), or leave data.vocab_file empty to train with the '
        'checkpoint\'s vocab.')


def vocab_rows(config) -> np.ndarray | None:
  """With config.init_vocab_by_token, the source's row of each token of the run's vocab by id
  ([model.vocab_size] int; -1: a token the source lacks, or a row beyond the vocab); None
  otherwise."""
  if not config.get('init_vocab_by_token', False):
    return None
  tokenizer = tokenizer_kind(config)
  source = {token: i for i, token in enumerate(
      vocab_tokens(config, source_vocab(config.init_from, tokenizer)))}
  rows = np.full((config.model.vocab_size,), -1, np.int64)
  for i, token in enumerate(vocab_tokens(config, config.data.vocab_file)[:len(rows)]):
    rows[i] = source.get(token, -1)
  return rows


def read_source(kind: str, path: str) -> tuple[dict, dict | None]:
  """(state dict of numpy arrays, HF config dict or None) of an hf: directory or a tf: checkpoint;
  ValueError naming the weights that hold NaN or inf (a damaged download would otherwise train
  from them, and the run's non-finite guard would blame the learning rate)."""
  if kind == 'hf':
    from bert_jax.interop import hf  # pylint: disable=g-import-not-at-top
    state_dict, hf_config = hf.load_hf_state_dict(path)
  else:
    from bert_jax.interop import tf_checkpoint  # pylint: disable=g-import-not-at-top
    state_dict, hf_config = tf_checkpoint.load_tf_bert(path)
  bad = [name for name, array in state_dict.items() if 'float' in np.asarray(array).dtype.name
         and not np.isfinite(np.asarray(array, np.float32)).all()]
  if bad:
    raise ValueError(f'{len(bad)} weight(s) hold NaN or inf ({", ".join(sorted(bad)[:3])}'
                     + (', ...' if len(bad) > 3 else '') + f') in {path}: the checkpoint is '
                     'damaged; download or export it again.')
  return state_dict, hf_config


def load_params(config, fresh_params):
  """The source's parameters in our layout; heads it lacks come from `fresh_params`."""
  kind, path = parse(config.init_from)
  if kind == 'workdir':
    return _load_workdir_params(path, parse_step(config.init_from), fresh_params)
  from bert_jax.interop import hf  # pylint: disable=g-import-not-at-top
  try:
    state_dict, hf_config = read_source(kind, path)
    # A missing, extra or misshaped weight: every problem in one error.
    params, report = hf.import_hf(state_dict, config, hf_config=hf_config,
                                  resize_vocab=config.init_resize_vocab, seed=config.seed,
                                  vocab_rows=vocab_rows(config))
  except (ValueError, OSError) as e:
    raise InitFromError(f'config.init_from={config.init_from!r}: {e}') from e
  logging.info('init_from %s: %s', config.init_from, report.summary())
  return hf.merge_missing(params, jax.device_get(fresh_params), config)


def import_for_finetuning(config) -> tuple[dict, dict]:
  """An hf: or tf: source for fine-tuning: (its parameters in the pretraining layout, config's
  objectives, without the subtrees the source lacks; {fine-tuning path: array} of the head of an
  HF <family>ForSequenceClassification checkpoint, {} for others)."""
  kind, path = parse(config.init_from)
  from bert_jax.interop import hf  # pylint: disable=g-import-not-at-top
  from bert_jax.models import hf_layout  # pylint: disable=g-import-not-at-top
  try:
    state_dict, hf_config = read_source(kind, path)
    state_dict, head_state = hf.split_classifier(state_dict, hf_layout.for_config(config))
    params, report = hf.import_hf(state_dict, config, hf_config=hf_config,
                                  resize_vocab=config.init_resize_vocab, seed=config.seed,
                                  vocab_rows=vocab_rows(config))
  except (ValueError, OSError) as e:
    raise InitFromError(f'config.init_from={config.init_from!r}: {e}') from e
  logging.info('init_from %s: %s', config.init_from, report.summary())
  return params, hf.import_classifier(head_state, hf_layout.for_config(config))


def _load_workdir_params(workdir: str, step: int | None, fresh_params):
  target = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), jax.device_get(fresh_params))
  params = match_layer_layout(workdir_params(workdir, step), target)
  check_same_structure(params, target, workdir)
  return params


def _encoder(params) -> dict:
  """The encoder subtree of a pretraining model's parameters ('bert/encoder') or of the
  encoder's own ('encoder'); {} when there is none."""
  return params.get('bert', params).get('encoder', {})


def match_layer_layout(params, target):
  """`params` with its encoder layers laid out as `target`'s: stacked under encoder/layer
  (model.scan_layers=True) or one subtree per layer (encoder/layer_N), whichever the source run
  used. The values are the same; only the tree differs. Both trees are a pretraining model's
  ('bert/encoder/...') or both an encoder's ('encoder/...')."""
  scanned = 'layer' in _encoder(params)
  if not _encoder(params) or not _encoder(target) or scanned == ('layer' in _encoder(target)):
    return params
  bare = 'bert' not in params  # The layer helpers name paths from 'bert/'.
  flat = param_tree.flatten({'bert': params} if bare else params)
  if scanned:
    flat = param_tree.unstack_layers(flat)
  else:
    pattern = param_tree.LAYER
    layers = {pattern.match(k).group(1) for k in flat if pattern.match(k)}
    flat = param_tree.stack_layers(flat, len(layers))
  tree = param_tree.unflatten(flat)
  return tree['bert'] if bare else tree


def workdir_params(workdir: str, step: int | None = None, name_step: str = 'WORKDIR@STEP'):
  """The parameters (host numpy) of a bert_jax workdir's checkpoint of `step` (None: the newest),
  read with the integrity check of a resume. A step that is missing or unreadable is an error
  naming the steps there are and how the caller names another (`name_step`), never a silent
  load of another step."""
  steps = checkpoint.checkpoint_steps(workdir)
  if not steps or (step is not None and step not in steps):
    raise InitFromError(_missing_step(workdir, step, steps, name_step) if steps else
                        f'{workdir!r} has no checkpoints to initialise from.')
  step = steps[-1] if step is None else step
  try:
    state, _ = checkpoint.read_step(os.path.join(workdir, 'checkpoints'), step)
  except Exception as e:  # Orbax's read errors and IntegrityError: pylint: disable=broad-except
    others = ', '.join(str(s) for s in steps if s != step) or 'none'
    text = str(e).strip().splitlines()[0][:300] if str(e).strip() else ''
    raise InitFromError(
        f'The checkpoint of step {step} in {workdir!r} cannot be read ({type(e).__name__}: '
        f'{text}); the other steps there: {others} (name one as {name_step}).') from e
  logging.info('init_from: parameters of step %d of %s.', step, workdir)
  return jax.tree.map(np.asarray, state['params'])


def check_same_structure(params, target, source) -> None:
  """Every parameter path and shape must agree; lists all differences at once."""
  flat = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(params)}
  want = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(target)}
  problems = [f'missing {k}' for k in sorted(set(want) - set(flat))]
  problems += [f'unexpected {k}' for k in sorted(set(flat) - set(want))]
  problems += [f'{k}: shape {tuple(flat[k].shape)}, expected {tuple(want[k].shape)}'
               for k in sorted(set(flat) & set(want)) if flat[k].shape != want[k].shape]
  if problems:
    raise InitFromError(f'The parameters in {source!r} do not fit this config: '
                        + '; '.join(problems))
