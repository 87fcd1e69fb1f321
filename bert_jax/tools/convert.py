"""Checkpoint conversion: the CLI and the Python API (HF and original TF checkpoints <-> bert_jax).

  python -m bert_jax.convert export --workdir=WORKDIR --out=DIR  # newest checkpoint -> HF dir
  python -m bert_jax.convert inspect --source=hf:DIR             # layout, config, key table

Python: `load_hf_state_dict` / `tf_checkpoint.load_tf_bert` -> `import_hf` -> params;
`export_hf(params, config, dir)`. Training from imported weights: `--config.init_from=hf:DIR`.
"""

import argparse
import json
import os
import re
import shutil
import sys

from absl import logging
import ml_collections

from bert_jax import models
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.core import files
from bert_jax.core.checkpoint import latest_step
from bert_jax.models import hf_layout
from bert_jax.interop import init_from
from bert_jax.interop.hf import (
    TABLE, CasingMismatchError, CheckpointMismatchError, ImportReport,
    UnsupportedConfigError, check_tokenizer_casing, entries, export_dirs, export_hf,
    export_tokenizer,
    hf_config_to_model_overrides, import_hf, init_params, leaf_shapes, load_hf_state_dict,
    merge_missing, model_to_hf_config, tokenizer_casing, _detect_layout)

# The Python API, re-exported from hf_interop so users import one module.
__all__ = [
    'TABLE', 'CasingMismatchError', 'CheckpointMismatchError', 'ImportReport',
    'UnsupportedConfigError', 'check_tokenizer_casing', 'entries', 'export_dirs', 'export_hf',
    'export_workdir',
    'hf_config_to_model_overrides', 'import_hf', 'init_params', 'leaf_shapes',
    'load_hf_state_dict', 'merge_missing', 'model_to_hf_config', 'tokenizer_casing', 'main']


# Written into each export: whose run and step it holds, so that exporting the same run again
# may replace it and nothing else is overwritten unasked.
EXPORT_RECORD = 'bert_jax_export.json'


def _check_out(out_dir: str, workdir: str, overwrite: bool) -> None:
  """ValueError unless out_dir may receive the export: new or empty, an earlier export of the
  same run, or (overwrite) any other directory; never the run's workdir or a folder around or
  inside it."""
  out = os.path.abspath(os.path.expanduser(out_dir))
  if not files.is_url(workdir):
    run = os.path.abspath(workdir)
    if out == run or out.startswith(run + os.sep) or run.startswith(out + os.sep):
      raise ValueError(f'--out={out_dir!r} is the run\'s workdir {workdir}, inside it or around '
                       'it; the export would mix with the run\'s files. Export to another '
                       'directory.')
  if not os.path.exists(out):
    return
  if not os.path.isdir(out):
    raise ValueError(f'--out={out_dir!r} is a file; give a directory (new, empty, or an earlier '
                     'export of this run).')
  names = sorted(os.listdir(out))
  if not names or overwrite:
    return
  try:
    with open(os.path.join(out, EXPORT_RECORD), encoding='utf-8') as f:
      record = json.load(f)
  except (OSError, ValueError):
    record = {}
  if isinstance(record, dict) and record.get('workdir') == workdir:
    return
  shown = ', '.join(names[:5]) + (f' and {len(names) - 5} more' if len(names) > 5 else '')
  raise ValueError(f'--out={out_dir!r} already holds {shown}, and is no export of {workdir}; '
                   'give a new or empty directory, or --overwrite to replace what it holds.')


def export_workdir(workdir: str, out_dir: str, step: int | None = None,
                   overwrite: bool = False) -> int:
  """Exports a training workdir's checkpoint (newest by default), config and vocab; returns step.
  The workdir may be gs://; out_dir is local. out_dir must be new, empty or an earlier export of
  the same run unless `overwrite`; the export is written beside it and renamed into place, so a
  failed export leaves out_dir as it was."""
  workdir = files.absolute(workdir)
  _check_out(out_dir, workdir, overwrite)
  with files.open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    config = ml_collections.ConfigDict(json.load(f))
  step = latest_step(workdir) if step is None else step
  if step is None:
    raise FileNotFoundError(f'No checkpoint in {os.path.join(workdir, "checkpoints")}.')
  # Read as a resume reads: a step whose bytes changed on disk is refused, never exported.
  params = init_from.workdir_params(workdir, step, name_step='--step=N')
  out = os.path.abspath(os.path.expanduser(out_dir))
  partial = f'{out}.partial-{os.getpid()}'
  shutil.rmtree(partial, ignore_errors=True)
  os.makedirs(os.path.dirname(out), exist_ok=True)
  try:
    _write_export(params, config, workdir, partial)
    with open(os.path.join(partial, EXPORT_RECORD), 'w', encoding='utf-8') as f:
      json.dump({'workdir': workdir, 'step': step}, f)
    if os.path.exists(out):
      previous = f'{out}.previous-{os.getpid()}'
      os.rename(out, previous)
      os.rename(partial, out)
      shutil.rmtree(previous)
    else:
      os.rename(partial, out)
  finally:
    shutil.rmtree(partial, ignore_errors=True)
  return step


def _write_export(params, config, workdir: str, out_dir: str) -> None:
  """The HF model directory (or ELECTRA's two) of `params` with the run's tokenizer files."""
  export_hf(params, config, out_dir)
  kind = config.data.get('tokenizer', 'wordpiece')
  # A trained vocab is kept in the workdir; a given one stays where config.data.vocab_file says.
  vocab_file = (tokenizer_lib.kept_vocab(kind, workdir)
                or os.path.expanduser(config.data.vocab_file))
  if vocab_file and files.isfile(vocab_file):
    vocab_file = files.local_copy(vocab_file, tokenizer_lib.KEPT_FILES[kind])
    # RoBERTa and XLM-R number positions from 2: two rows fewer than max_position_embeddings.
    offset = models.get(config.model.get('name', 'bert')).position_offset
    for directory in export_dirs(config, out_dir):  # ELECTRA's: two models.
      export_tokenizer(vocab_file, config.data.lowercase, directory,
                       config.model.max_position_embeddings - offset, kind)
  else:
    logging.warning('No %s in %s and config.data.vocab_file=%r is not a file: the export has no '
                    'tokenizer files.', ' + '.join(tokenizer_lib.KEPT_FILES[kind]), workdir,
                    config.data.vocab_file)


def describe(source_dir: str) -> str:
  """The CLI's inspect text: layout, config, key table and whether it imports cleanly."""
  from configs import base  # pylint: disable=g-import-not-at-top
  state_dict, hf_config = load_hf_state_dict(source_dir)
  lines = [f'source: {source_dir}', f'keys: {len(state_dict)}']
  try:
    layout = _family_layout(state_dict, hf_config)
  except UnsupportedConfigError as e:
    return '\n'.join(lines + [str(e)])
  layout_name, prefix, heads = _detect_layout(state_dict, layout)
  lines.append(f'layout: {layout_name}')
  config = base.get_config()
  config.model.name = layout.family
  num_layers = len({m.group(1) for m in map(re.compile(r'encoder\.layer\.(\d+)\.').search,
                                             state_dict) if m})
  table = entries(num_layers, prefix, layout)
  # A head checkpoint without a head's keys came from a model without it; a backbone says nothing.
  extra = [g for g in dict.fromkeys(e.group for e in table)
           if g not in ('backbone', 'pooler', 'mlm')]
  present = [g for g in extra
             if not heads or any(e.hf_key in state_dict for e in table if e.group == g)]
  config.objectives = ','.join(['mlm'] + present)
  if hf_config is not None:
    lines.append('config.json: ' + json.dumps(hf_config, sort_keys=True))
    try:
      config.model.update(hf_config_to_model_overrides(hf_config))
      lines.append(f'config.model overrides: {hf_config_to_model_overrides(hf_config)}')
    except UnsupportedConfigError as e:
      lines.append(str(e))
  lines.append(f'\n{"HF key":60s} {"shape":>14s} {"dtype":8s} -> ours (transform)')
  mapped = set()
  for e in table:
    if e.hf_key in state_dict and not re.search(r'layer\.[1-9]\d*\.', e.hf_key):
      value = state_dict[e.hf_key]
      layer_note = f' x{num_layers} layers' if 'layer.0.' in e.hf_key else ''
      lines.append(f'{e.hf_key:60s} {str(tuple(value.shape)):>14s} {str(value.dtype):8s} -> '
                   f'{e.path} ({e.transform}){layer_note}')
    mapped.add(e.hf_key)
  for key in sorted(set(state_dict) - mapped):
    status = 'ignored buffer' if layout.ignored.match(key) else 'UNEXPECTED'
    lines.append(f'{key:60s} {str(tuple(state_dict[key].shape)):>14s} -> {status}')
  try:
    _, report = import_hf(state_dict, config, hf_config=hf_config)
    lines.append(f'\nimports cleanly (objectives={config.objectives}): {report.summary()}')
  except (CheckpointMismatchError, UnsupportedConfigError) as e:
    lines.append(f'\ndoes not import: {e}')
  return '\n'.join(lines)


def _family_layout(state_dict, hf_config):
  """The family of a checkpoint: its config.json's model_type, else the backbone prefix its keys
  carry (BERT when they carry none)."""
  if hf_config is not None:
    return hf_layout.for_hf_config(hf_config)
  for layout in hf_layout.layouts():
    if any(k.startswith(layout.prefix) for k in state_dict):
      return layout
  return hf_layout.for_family('bert')


def main(argv=None) -> None:
  """`export --workdir=W --out=DIR [--step=N]` or `inspect --source=hf:DIR`."""
  parser = argparse.ArgumentParser(prog='python -m bert_jax.convert', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  commands = parser.add_subparsers(dest='command', required=True)
  export = commands.add_parser('export', help='workdir checkpoint -> HF model dir (the family\'s '
                               'class: BertForPreTraining, RobertaForMaskedLM, ...)')
  export.add_argument('--workdir', required=True)
  export.add_argument('--out', required=True)
  export.add_argument('--step', type=int, default=None, help='Checkpoint step (default newest).')
  export.add_argument('--overwrite', action='store_true',
                      help='Replace what --out holds (by default only a new or empty directory, '
                      'or an earlier export of the same run, is written).')
  inspect = commands.add_parser('inspect', help='show an HF checkpoint and how it maps')
  inspect.add_argument('--source', required=True, help='hf:DIR (or hf:FILE)')
  args = parser.parse_args(argv)
  logging.set_verbosity(logging.WARNING)
  try:
    if args.command == 'export':
      step = export_workdir(args.workdir, args.out, args.step, args.overwrite)
      print(f'Exported step {step} of {args.workdir} to {args.out}')
      return
    kind, _, source = args.source.partition(':')
    if kind != 'hf' or not source:
      parser.error(f'--source={args.source!r}: expected hf:DIR')
    print(describe(source))
  except (OSError, ValueError) as e:  # Bad paths and mismatches: one line, not a traceback.
    sys.exit(f'{args.command} failed: {e}')


def run_command():
  # `configs` lives at the repository root: make it importable from anywhere, as main.py does.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  from bert_jax.core import chips  # pylint: disable=g-import-not-at-top
  from bert_jax.core import errors  # pylint: disable=g-import-not-at-top
  chips.quiet_absent_tpu()  # Before JAX starts.
  errors.quiet_closed_loop_echoes()
  main()


if __name__ == '__main__':
  run_command()
