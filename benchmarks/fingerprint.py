"""A change's guard: the lowered train step of each family and the tiny quickstart's losses.

A change that only moves code (a restructure step, a rename) must leave every family's train
step as XLA receives it, and the tiny quickstart's first losses, exactly as they were. This prints
both, one line each, so that two commits compare with `diff`:

  python benchmarks/fingerprint.py > /tmp/after.txt
  git stash; python benchmarks/fingerprint.py > /tmp/before.txt; git stash pop
  diff /tmp/before.txt /tmp/after.txt   # No output: the change trains as its parent did.

Each family line is the sha256 of its pretraining step at a small shape (2 layers, 64 wide, seq
32, batch 64, at most 2 micro-batches; vocab and recipe as the family's config), lowered on this machine's first device
as `python -m bert_jax.main` jits it, as StableHLO text without debug locations (so that moving
a function between files changes nothing, while changing what it computes does). Lowering only:
nothing compiles, a family takes a second or two on CPU. `--losses` adds the tiny quickstart
(`configs/tiny.py:steps=60`, the built-in corpus; about 30 s on 2 CPU cores), whose losses at
steps 0, 20, 40 and 60 must match to the last digit. Without `--family=NAME` (repeatable: those
families only) it first prints a sha256 of each shipped config's flattened keys and values.
"""

import argparse
import glob
import hashlib
import importlib.util
import json
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # Run as a script (`python benchmarks/fingerprint.py`).
  sys.path.insert(0, REPO)

# A shape small enough to lower in a second, with each family's own recipe around it.
SHAPE = 'layers=2,hidden=64,heads=2,seq=32,batch=64,corpus=builtin'
SHAPE_OVERRIDES = {'model.intermediate_size': 128}
# Family -> its config file and arguments (configs/<file>.py:ARGS), beside SHAPE.
FAMILIES = {
    'bert': 'configs/base.py',
    # The TPU attention kernel (Pallas, interpreted on CPU) in bf16: the kernel path's step.
    'bert_tpu_kernel_bf16': 'configs/base.py',
    'roberta': 'configs/roberta.py',
    'albert': 'configs/albert.py',
    'spanbert': 'configs/spanbert.py',
    'electra': 'configs/electra.py',
    'distilbert': 'configs/distilbert.py',
    'deberta': 'configs/deberta.py',
    'deberta_rtd': 'configs/deberta.py:objective=rtd',
    'modernbert': 'configs/modernbert.py',
    'xlmr': 'configs/xlm.py',
}
# The families whose shape keys live elsewhere too (the distillation teacher is the student's
# width; ALBERT's embeddings are narrower than H).
FAMILY_OVERRIDES = {
    'distilbert': {'distill.teacher_model.hidden_size': 64, 'distill.teacher_model.num_heads': 2,
                   'distill.teacher_model.intermediate_size': 128,
                   'distill.teacher_model.num_layers': 4},
    'albert': {'model.embedding_size': 32},
    'bert_tpu_kernel_bf16': {'model.attention_impl': 'tpu', 'model.dtype': 'bfloat16'},
}
# Shipped config files without a get_config (helpers) are skipped.
CONFIG_FILES = 'configs/*.py'
QUICKSTART = ['--config=configs/tiny.py:steps=60', '--config.train.log_every=20']


def load_config(spec: str):
  """A config from 'configs/FILE.py[:ARGS]', with SHAPE appended to its arguments."""
  path, _, args = spec.partition(':')
  args = ','.join(a for a in (args, SHAPE) if a)
  loaded = importlib.util.spec_from_file_location('fingerprint_config', os.path.join(REPO, path))
  source = importlib.util.module_from_spec(loaded)
  loaded.loader.exec_module(source)
  return source.get_config(args)


def set_key(config, key: str, value) -> None:
  *parents, leaf = key.split('.')
  node = config
  for parent in parents:
    node = node[parent]
  node[leaf] = value


def family_config(name: str):
  config = load_config(FAMILIES[name])
  for key, value in {**SHAPE_OVERRIDES, **FAMILY_OVERRIDES.get(name, {})}.items():
    set_key(config, key, value)
  # A recipe that accumulates (RoBERTa 32, ModernBERT 18 micro-batches) keeps doing so, in 2.
  config.train.grad_accum_steps = min(config.train.grad_accum_steps, 2)
  # The step lowered is the full batch's (a batch-size warmup's smaller ones are its own).
  config.train.batch_warmup_rows = config.train.batch_warmup_tokens = 0
  return config


def lowered_text(config) -> str:
  """The pretraining train step as pretrain.py jits it (train/step.lower_pretraining_step, as
  bert_jax.aot lowers it), for this machine's devices, as text without source locations."""
  from bert_jax import config_lib  # pylint: disable=g-import-not-at-top
  from bert_jax import sharding  # pylint: disable=g-import-not-at-top
  from bert_jax.train import step as steps  # pylint: disable=g-import-not-at-top
  config_lib.validate(config)
  lowered = steps.lower_pretraining_step(config, sharding.create_mesh(config.mesh))
  return lowered.as_text(debug_info=False)


def config_digests() -> list[str]:
  """'config FILE sha256' of each shipped config (no arguments), flattened and sorted: a move of
  a key's declaration must leave every config's keys and values as they were."""
  from bert_jax.core import schema  # pylint: disable=g-import-not-at-top
  lines = []
  for path in sorted(glob.glob(os.path.join(REPO, CONFIG_FILES))):
    loaded = importlib.util.spec_from_file_location('fingerprint_config', path)
    source = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(source)
    if not hasattr(source, 'get_config'):
      continue
    flat = sorted(schema.flatten(source.get_config()).items())
    text = '\n'.join(f'{key}={value!r}' for key, value in flat)
    lines.append(f'config {os.path.relpath(path, REPO)} '
                 f'{hashlib.sha256(text.encode()).hexdigest()}')
  return lines


def quickstart_losses() -> list[str]:
  """'step N split loss' of the tiny quickstart's records, every digit kept."""
  import subprocess  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as workdir:
    subprocess.run([sys.executable, '-m', 'bert_jax.main', *QUICKSTART, f'--workdir={workdir}'],
                   check=True, cwd=REPO, capture_output=True)
    with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
      records = [json.loads(line) for line in f]
  return [f'quickstart step {r["step"]} {r["split"]} loss {r["loss"]!r}'
          for r in records if 'loss' in r and r.get('split') in ('train', 'eval')]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--family', action='append', choices=sorted(FAMILIES),
                      help='a family to fingerprint (repeatable); default every family')
  parser.add_argument('--losses', action='store_true',
                      help="also run the tiny quickstart and print its losses")
  args = parser.parse_args(argv)
  if not args.family:
    for line in config_digests():
      print(line, flush=True)
  for name in args.family or FAMILIES:
    digest = hashlib.sha256(lowered_text(family_config(name)).encode()).hexdigest()
    print(f'{name} {digest}', flush=True)
  if args.losses:
    for line in quickstart_losses():
      print(line, flush=True)
  return 0


if __name__ == '__main__':
  # The text depends on the backend it is lowered for: CPU, wherever it runs (a TPU VM too).
  os.environ['JAX_PLATFORMS'] = 'cpu'
  sys.exit(main())
