"""The paper-scale TPU table: compiles each setup with `python -m bert_jax.aot`, projects run times.

  python experiments/aot_table.py [--results=experiments/aot_results.jsonl] [--only=NAME,...]

Each setup is tried with the presets of its `tries` in order until one fits in HBM (the first
that fits is the one we recommend); every attempt's JSON is appended to the results file, and
setups already there are skipped, so an interrupted table resumes. Then the markdown table and
the projections are printed (and written next to the results, as .md).

Projections multiply the compiled step's estimated time (libtpu's cost model, per aot.py) by the
step count of the recipe: the paper's 1M steps at 256 x 512 (its stated batch) and its actual
schedule, 90% of the steps at 128 and 10% at 512; You et al.'s LAMB run, 7,038 steps of 65,536 x
128 and 1,561 of 32,768 x 512, against their 76 minutes; RoBERTa's 500k and ALBERT's 125k steps
as 32 and 16 micro-batch steps each. Estimates are idealised (no input
pipeline, no host overhead, perfect overlap), so they are lower bounds on wall time.

A second table sets each '-tpu' setup (attention_impl='tpu', the Pallas TPU attention kernels)
beside its XLA-attention twin, with the share of the step's FLOPs the kernels declare and the
roofline with and without their declared work.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ_512 = ['--config.data.max_seq_length=512', '--config.data.max_predictions_per_seq=80']
BF16 = ['--config.model.dtype=bfloat16']
MICRO_BATCH = ['--config.train.batch_size=256', '--config.train.grad_accum_steps=1']
NO_PROBES = ['--layer_probes=false']
TPU_ATTENTION = ['--config.model.attention_impl=tpu']
# Presets tried in order; the first that fits is recommended.
FSDP = ['--config.mesh.preset=fsdp', '--config.mesh.data=-1', '--config.mesh.fsdp=16']
DATA_THEN_FSDP = [
    ('data', ['--config.mesh.preset=data']),
    ('data+remat', ['--config.mesh.preset=data', '--config.model.remat_policy=dots']),
    ('fsdp16', FSDP),
    ('fsdp16+remat', FSDP + ['--config.model.remat_policy=dots']),
    ('fsdp16+full remat', FSDP + ['--config.model.remat_policy=full']),
]

# name: (config, topology, overrides, presets)
SETUPS = {
    'base-v3:4x4-512': ('configs/base.py', 'v3:4x4', SEQ_512 + BF16, DATA_THEN_FSDP),
    'base-v3:4x4-128': ('configs/base.py', 'v3:4x4', BF16, DATA_THEN_FSDP),
    'large-v3:8x8-512': ('configs/large.py', 'v3:8x8', SEQ_512 + BF16, DATA_THEN_FSDP),
    'large-v3:8x8-128': ('configs/large.py', 'v3:8x8', BF16, DATA_THEN_FSDP),
    'large-v4:2x2x4-512': ('configs/large.py', 'v4:2x2x4', SEQ_512 + BF16, DATA_THEN_FSDP),
    'large-v5e:8x8-512': ('configs/large.py', 'v5e:8x8', SEQ_512 + BF16, DATA_THEN_FSDP),
    'large-v5p:4x4x4-512': ('configs/large.py', 'v5p:4x4x4', SEQ_512 + BF16, DATA_THEN_FSDP),
    'large-v6e:4x4-512': ('configs/large.py', 'v6e:4x4', SEQ_512 + BF16, DATA_THEN_FSDP),
    'lamb-phase1-v3:32x32': ('configs/large_lamb.py', 'v3:32x32', [], DATA_THEN_FSDP),
    'lamb-phase2-v3:32x32': ('configs/large_lamb.py:phase=2', 'v3:32x32', [], DATA_THEN_FSDP),
    # The family at its recipes' micro-batch (256 x 512): RoBERTa's batch of 8192 and ALBERT's
    # of 4096 accumulate 32 and 16 of these steps (train.grad_accum_steps). RoBERTa-large is
    # compiled without the layer probes (most of a compile's time on a small CPU machine): its
    # scanned layers are costed once, so the table gives memory and fit, no step time.
    **{f'{model}-{size}-{topology}-512': (
        f'configs/{model}.py:size={size}', topology,
        MICRO_BATCH + BF16 + (NO_PROBES if (model, size) == ('roberta', 'large') else []),
        DATA_THEN_FSDP)
       for model, size in (('roberta', 'base'), ('roberta', 'large'), ('albert', 'base'),
                           ('albert', 'large'), ('albert', 'xlarge'))
       for topology in (('v3:4x4', 'v5e:4x4') if size == 'base' else ('v3:8x8', 'v5e:8x8'))},
    # RoBERTa-large's whole recipe step: 8192 rows as 32 accumulated micro-batches.
    'roberta-large-v5e:8x8-512-recipe': ('configs/roberta.py:size=large', 'v5e:8x8',
                                         BF16 + NO_PROBES, DATA_THEN_FSDP),
    # SpanBERT's recipe step is one such micro-batch: 256 rows of 512, MLM + SBO.
    **{f'spanbert-{size}-{topology}-512': (f'configs/spanbert.py:size={size}', topology,
                                           MICRO_BATCH + BF16, DATA_THEN_FSDP)
       for size, topologies in (('base', ('v3:4x4', 'v5e:4x4')), ('large', ('v3:8x8', 'v5e:8x8')))
       for topology in topologies},
    # ELECTRA's and DistilBERT's recipe steps (a micro-batch of 256: ELECTRA-small's rows are
    # 128 tokens), memory and fit only. The DistilBERT student's frozen BERT-base teacher is
    # compiled in its step; a teacher's config.json is all the shapes need.
    'electra-small-v5e:4x4-128': ('configs/electra.py:size=small', 'v5e:4x4',
                                  MICRO_BATCH + BF16 + NO_PROBES, DATA_THEN_FSDP),
    'electra-base-v5e:4x4-512': ('configs/electra.py:size=base', 'v5e:4x4',
                                 MICRO_BATCH + BF16 + NO_PROBES, DATA_THEN_FSDP),
    'distilbert-v5e:4x4-512': ('configs/distilbert.py', 'v5e:4x4',
                               MICRO_BATCH + BF16 + NO_PROBES
                               + ['--config.distill.teacher=hf:experiments/teachers/bert-base'],
                               DATA_THEN_FSDP),
    # ModernBERT-base's micro-batch: 256 rows of 1024 (its recipe accumulates 18), memory and fit.
    'modernbert-base-v5e:4x4-1024': ('configs/modernbert.py:size=base', 'v5e:4x4',
                                     MICRO_BATCH + BF16 + NO_PROBES, DATA_THEN_FSDP),
    # BERT-Large with the Pallas TPU attention kernels (attention_impl='tpu'), each beside the
    # same setup with the XLA attention (the name without '-tpu'); the kernels' FLOPs and bytes
    # in these estimates are their declared costs (aot.py's kernel_* fields).
    **{f'large-{topology}-{seq}': ('configs/large.py', topology, BF16, DATA_THEN_FSDP)
       for topology in ('v4:2x2x4', 'v5e:8x8', 'v5p:4x4x4', 'v6e:4x4') for seq in (128,)},
    **{f'large-{topology}-{seq}-tpu': ('configs/large.py', topology,
                                       (SEQ_512 if seq == 512 else []) + BF16 + TPU_ATTENTION,
                                       DATA_THEN_FSDP)
       for topology in ('v5e:8x8', 'v6e:4x4', 'v4:2x2x4', 'v5p:4x4x4') for seq in (512, 128)},
    # The largest Large-512 batch that fits v5e:8x8's 16 GiB per chip with each attention, data
    # parallel without remat: memory only (8, 12 and 16 rows per chip).
    **{f'large-v5e:8x8-512-b{batch}{suffix}': (
        'configs/large.py', 'v5e:8x8',
        SEQ_512 + BF16 + [f'--config.train.batch_size={batch}'] + NO_PROBES + impl,
        DATA_THEN_FSDP[:1])
       for suffix, impl in (('', []), ('-tpu', TPU_ATTENTION)) for batch in (512, 768, 1024)},
}

def _tpu_setups():
  """configs/tpu.py's setting for each (generation, size, seq), on the slice it names; if it
  does not fit, the same with remat 'dots', then sharded (fsdp over every device)."""
  sys.path.insert(0, REPO)
  from configs import tpu  # pylint: disable=g-import-not-at-top
  setups = {}
  for (gen, size, seq), choice in tpu.SLICES.items():
    setups[f'tpu-{gen}-{size}-{seq}'] = (
        f'configs/tpu.py:gen={gen},size={size},seq={seq}', choice.topology, [],
        [('config', []), ('config+remat', ['--config.model.remat_policy=dots']),
         ('config+fsdp', ['--config.mesh.preset=fsdp', '--config.mesh.data=1',
                          '--config.mesh.fsdp=-1'])])
  return setups


SETUPS.update(_tpu_setups())
PAPER_STEPS = 1_000_000
LAMB_STEPS = {'lamb-phase1-v3:32x32': 7_038, 'lamb-phase2-v3:32x32': 1_561}
LAMB_MINUTES = 76
# The family's recipes: (optimizer steps, micro-batches of 256 per step).
FAMILY_RECIPES = {'roberta-base': (500_000, 32), 'roberta-large': (500_000, 32),
                  'albert-base': (125_000, 16), 'albert-large': (125_000, 16),
                  'albert-xlarge': (125_000, 16), 'spanbert-base': (2_400_000, 1),
                  'spanbert-large': (2_400_000, 1)}


def run_setup(name, results_path):
  config, topology, overrides, presets = SETUPS[name]
  for preset, preset_flags in presets:
    command = [sys.executable, '-m', 'bert_jax.aot', f'--config={config}',
               f'--topology={topology}', *overrides, *preset_flags]
    print(f'[{time.strftime("%H:%M:%S")}] {name} ({preset}): {" ".join(command[1:])}',
          flush=True)
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith('{')]
    if not lines:
      record = {'error': proc.stderr.strip().splitlines()[-1:], 'returncode': proc.returncode}
    else:
      record = json.loads(lines[-1])
    record.update(setup=name, tried_preset=preset, wall_s=round(time.perf_counter() - start, 1),
                  command='python ' + ' '.join(command[1:]))
    with open(results_path, 'a', encoding='utf-8') as f:
      f.write(json.dumps(record) + '\n')
    print(f'  fits={record.get("fits")} needed_gib={record.get("needed_gib")} '
          f'step_s={record.get("step_time_s")} wall={record["wall_s"]}s', flush=True)
    if record.get('fits'):
      return


def load(results_path):
  records = []
  if os.path.exists(results_path):
    with open(results_path, encoding='utf-8') as f:
      records = [json.loads(line) for line in f if line.strip()]
  return records


def recommended(records):
  """setup name -> the first attempt that fit."""
  out = {}
  for record in records:
    if record.get('fits') and record['setup'] not in out:
      out[record['setup']] = record
  return out


def hours(seconds):
  return f'{seconds / 3600:.1f} h' if seconds >= 3600 else f'{seconds / 60:.1f} min'


def costed(record) -> bool:
  """Whether the step time counts every layer (probes, or no scan): else an underestimate."""
  return 'underestimate' not in record.get('step_time_source', '')


def kernel_table(records) -> str:
  """The '-tpu' setups beside their XLA-attention twins: memory, step time and MFU of each, and
  how much of the 'tpu' estimate the kernels' declared costs make."""
  fits = recommended(records)
  rows = ['| setup | attention | preset | GiB needed | step time | MFU | roofline | '
          'kernel FLOPs share | roofline without kernels |',
          '|---|---|---|---|---|---|---|---|---|']
  for name in SETUPS:
    if not name.endswith('-tpu') or not any(r['setup'] == name for r in records):
      continue
    for impl, setup in (('xla', name[:-len('-tpu')]), ('tpu', name)):
      r = fits.get(setup)
      if r is None:
        tried = [a for a in records if a['setup'] == setup]
        if tried:
          # libtpu's refusal names what it needed, e.g. 'HLO temporaries (17.41G) exceeds ...'.
          refused = re.search(r'\(([\d.]+G)\) exceeds', tried[-1].get('out_of_memory', ''))
          needed = (f'> HBM ({refused.group(1)} temporaries)' if refused
                    else tried[-1].get('needed_gib', ''))
          rows.append(f'| {setup} | {impl} | none fits | {needed} | | | | | |')
        continue
      step, mfu, roofline, share, without = 'not costed', '', '', '', ''
      if costed(r):
        step, mfu = f'{1000 * r["step_time_s"]:.0f} ms', f'{100 * r["mfu"]:.0f}%'
        roofline = f'{1000 * r["roofline_s"]:.0f} ms'
        if impl == 'tpu':
          share = f'{100 * r["kernel_flops_share"]:.1f}%'
          without = f'{1000 * r["roofline_without_kernels_s"]:.0f} ms'
      rows.append(f'| {setup} | {impl} | {r["tried_preset"]} | {r["needed_gib"]:.1f} '
                  f'| {step} | {mfu} | {roofline} | {share} | {without} |')
  return '\n'.join(rows) if len(rows) > 2 else ''


def binding(record) -> str:
  """Which roofline term is the larger: 'FLOPs' or 'bytes'."""
  spec = record['peak_tflops_per_chip'] * 1e12 / (record['num_devices'] // record['num_chips'])
  compute = record['flops_per_device'] / spec
  return 'FLOPs' if compute >= record['roofline_s'] * 0.999 else 'bytes'


def generation_table(records) -> str:
  """configs/tpu.py's setups: the slice, rows per device, memory, libtpu's estimate and MFU,
  what binds the roofline and the three parts of the step that move the most bytes."""
  fits = recommended(records)
  rows = ['| setup | slice (chips) | rows per device | GiB needed / HBM | step estimate | binds '
          '| MFU | most bytes (GB per device per step) |', '|---|---|---|---|---|---|---|---|']
  for name in SETUPS:
    if not name.startswith('tpu-'):
      continue
    r = fits.get(name)
    if r is None:
      tried = [a for a in records if a['setup'] == name]
      if tried:
        rows.append(f'| {name} | {SETUPS[name][1]} | | none fits '
                    f'({", ".join(a["tried_preset"] for a in tried)}) | | | | |')
      continue
    source = 'libtpu' if r['step_time_source'].startswith('xla') else 'roofline'
    parts = sorted(r.get('bytes_by_part', {}).items(), key=lambda item: -item[1])[:3]
    most = ', '.join(f'{part} {value / 1e9:.0f}' for part, value in parts)
    rows.append(
        f'| {name} | {r["topology"]} ({r["num_chips"]}) | {r["batch"] // r["num_devices"]} '
        f'| {r["needed_gib"]:.1f} / {r["hbm_per_device_gib"]} ({r["tried_preset"]}) '
        f'| {1000 * r["step_time_s"]:.0f} ms ({source}) | {binding(r)} '
        f'| {100 * r["mfu"]:.0f}% | {most} |')
  return '\n'.join(rows) if len(rows) > 2 else ''


def markdown(records) -> str:
  fits = recommended(records)
  rows = ['| setup | chips | preset (mesh) | batch x seq | GiB needed / HBM per device | '
          'step time | MFU | compile |',
          '|---|---|---|---|---|---|---|---|']
  for name in SETUPS:
    attempts = [r for r in records if r['setup'] == name]
    if not attempts:
      continue
    r = fits.get(name)
    if r is None:
      last = attempts[-1]
      rows.append(f'| {name} | | none fits ({", ".join(a["tried_preset"] for a in attempts)}) '
                  f'| | {last.get("needed_gib", last.get("out_of_memory", last.get("error")))} '
                  '| | | |')
      continue
    mesh = 'x'.join(str(v) for v in r['mesh'].values())
    # Scanned layers costed once (no probes): the step time is an underestimate, left out.
    step = f'{1000 * r["step_time_s"]:.0f} ms' if costed(r) else 'not costed'
    mfu = f'{100 * r["mfu"]:.0f}%' if costed(r) else ''
    rows.append(
        f'| {name} | {r["num_chips"]} {r["device_kind"]} | {r["tried_preset"]} ({mesh}) '
        f'| {r["batch"]} x {r["seq"]} | {r["needed_gib"]:.1f} / {r["hbm_per_device_gib"]} '
        f'| {step} | {mfu} | {r["compile_s"]:.0f} s |')
  kernels = kernel_table(records)
  generations = generation_table(records)
  out = (['\n'.join(rows), ''] + ([kernels, ''] if kernels else [])
         + ([generations, ''] if generations else []))
  proj = []
  for model, short, long in (('BERT-Base', 'base-v3:4x4-128', 'base-v3:4x4-512'),
                             ('BERT-Large', 'large-v3:8x8-128', 'large-v3:8x8-512')):
    if short in fits and long in fits:
      t128, t512 = fits[short]['step_time_s'], fits[long]['step_time_s']
      proj.append(f'- {model} on {fits[long]["num_chips"]} TPU v3 chips: 1M steps at 256 x 512 '
                  f'{hours(PAPER_STEPS * t512)}; the paper\'s schedule (900k steps at 128, '
                  f'100k at 512) {hours(0.9 * PAPER_STEPS * t128 + 0.1 * PAPER_STEPS * t512)} '
                  '(paper: 4 days).')
  for name in ('large-v4:2x2x4-512', 'large-v5e:8x8-512', 'large-v5p:4x4x4-512',
               'large-v6e:4x4-512'):
    if name in fits:
      r = fits[name]
      proj.append(f'- BERT-Large, 1M steps at 256 x 512 on {r["num_chips"]} chips of '
                  f'{r["topology"]}: {hours(PAPER_STEPS * r["step_time_s"])}.')
  for name, r in fits.items():
    model = name.split('-v')[0]
    if model in FAMILY_RECIPES and r['batch'] == 256 and 'underestimate' not in r.get(
        'step_time_source', ''):
      steps, micro = FAMILY_RECIPES[model]
      proj.append(f'- {model} recipe ({steps // 1000}k steps of {micro} micro-batches of 256 x '
                  f'512) on {r["num_chips"]} chips of {r["topology"]}: '
                  f'{hours(steps * micro * r["step_time_s"])}.')
  if all(name in fits for name in LAMB_STEPS):
    total = sum(steps * fits[name]['step_time_s'] for name, steps in LAMB_STEPS.items())
    proj.append(f'- LAMB recipe (You et al.) on 1,024 TPU v3 chips: {hours(total)} projected '
                f'against their {LAMB_MINUTES} min.')
  out.append('\n'.join(proj))
  return '\n'.join(out) + '\n'


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--results', default=os.path.join(REPO, 'experiments',
                                                        'aot_results.jsonl'))
  parser.add_argument('--only', default='', help='Comma-separated setup names.')
  args = parser.parse_args()
  names = [n for n in args.only.split(',') if n] or list(SETUPS)
  unknown = [n for n in names if n not in SETUPS]
  if unknown:
    sys.exit(f'Unknown setups {unknown}; valid: {", ".join(SETUPS)}.')
  done = {r['setup'] for r in load(args.results)}
  for name in names:
    if name not in done:
      run_setup(name, args.results)
  table = markdown(load(args.results))
  with open(os.path.splitext(args.results)[0] + '.md', 'w', encoding='utf-8') as f:
    f.write(table)
  print(table)


if __name__ == '__main__':
  main()
