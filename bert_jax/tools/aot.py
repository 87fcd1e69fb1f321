"""Compiles the real train step for a TPU slice on a CPU machine; prints one JSON object.

`python -m bert_jax.aot --config=configs/large.py --topology=v4:2x2x4 [--num_slices=2]
 [--config.KEY=VALUE ...]`

Needs libtpu (`pip install "jax[tpu]"`), not a TPU: libtpu describes the slice's devices and
compiles for them, as MaxText's train_compile.py does. The step is steps.jit_pretraining_step, the one
pretrain.py trains with, over config.train.batch_size x config.data.max_seq_length; no corpus or
tokenizer is read (the vocabulary is config.model.vocab_size).

Per-device memory (XLA's buffer assignment): total = arguments + outputs + temporaries +
generated code - aliases (the donated state's buffers are reused for the new state, so they count
once). libtpu also reports a peak (`xla_peak_bytes`), and with scanned layers it can put the
temporaries there and report temp 0; `needed_gib` is the larger of the two, and `fits` compares
it with the HBM of one device (a v3 device is one core, 16 of the chip's 32 GiB). When libtpu
itself finds the step too big it refuses to compile it; the JSON then has `fits: false` and its
message in `out_of_memory`. The exit status is 2 whenever the step does not fit.

FLOPs and step time: XLA's cost analysis of the partitioned program, i.e. per device.
`optimal_seconds` is libtpu's own estimate of the step's run time from its cost model (idealised,
so the implied MFU is an upper bound); libtpu gives none for v4 (it reports a negative number),
and then the step time is the roofline max(FLOPs / peak bf16, bytes accessed / HBM bandwidth),
which `roofline_s` always shows. A scanned layer stack is a while loop whose body XLA costs once,
so with config.model.scan_layers the cost comes from 1- and 2-layer unrolled probes, linear in
layers (`layer_probes`); the raw numbers of the compiled step stay in the `xla_*` fields. MFU
uses the model FLOPs of metrics.model_flops_per_sequence (DESIGN.md's formula) against the chips'
peak; `step_time_source` says where the step time came from.

Mosaic kernels (attention_impl='tpu'): XLA cannot see inside them, and libtpu's cost analysis
counts the cost each pallas_call declares (its cost_estimate), FLOPs and bytes exactly, in the
FLOPs, bytes and optimal_seconds above. `kernel_flops_per_device` and `kernel_bytes_per_device`
are those declarations summed over the step's kernel calls (`kernel_calls_per_device`; counted
as the FLOPs are, probes included), `kernel_flops_share` their part of the FLOPs, and
`flops_without_kernels_per_device`, `bytes_without_kernels_per_device` and
`roofline_without_kernels_s` the estimate from what XLA costs itself; `kernel_roofline_s` is the
declared work alone at peak. They show how much of the step time rests on the declarations,
which no TPU has checked. Without kernels they are 0 and the `without` fields equal the others.

Where the bytes go (step_parts): `bytes_by_part` splits the step's HBM bytes between attention,
feed-forward, norms, embeddings, heads and loss, optimizer update, collectives and copies, from
each instruction's op_name (the Flax module path), counted as probes count the rest;
`bytes_by_part_share` is each part's share, `bytes_by_part_coverage` their sum against libtpu's
total, and `cycles_by_part_share` the split of libtpu's own per-instruction cycle estimates.
"""

import copy
import importlib.util
import json
import math
import os
import re
import sys
import time

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from bert_jax.core import chips
from bert_jax.core import cli
from bert_jax.tools import kernel_costs
from bert_jax.tools import step_parts
from bert_jax.core.chips import TPU_SPECS, TpuSpec  # noqa: F401  (re-exported)

# Config files import `configs.base`: make the repository root importable from anywhere.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Config file, e.g. configs/large.py.')
_TOPOLOGY = flags.DEFINE_string('topology', None, 'TPU slice, e.g. v4:2x2x4, v5e:8x8, v3:4x4.')
_NUM_SLICES = flags.DEFINE_integer('num_slices', 1, 'Slices joined over DCN (multi-slice); the '
                                   'data axis spans them (config.mesh.dcn_data).')
_PROBES = flags.DEFINE_bool('layer_probes', True, 'With scanned layers, also compile 1- and '
                             '2-layer unrolled probes so FLOPs and step time count every layer.')
flags.mark_flags_as_required(['config', 'topology'])

GiB = 2**30


EXAMPLE_TOPOLOGIES = ('v3:2x2', 'v3:4x4', 'v3:8x8', 'v3:32x32', 'v4:2x2x1', 'v4:2x2x4',
                      'v4:4x4x4', 'v5e:2x2', 'v5e:8x8', 'v5e:16x16', 'v5p:2x2x1', 'v5p:4x4x4',
                      'v6e:2x2', 'v6e:4x4', 'v6e:16x16')


class TopologyError(ValueError):
  """A topology libtpu cannot describe."""


def _topology_help() -> str:
  return f'valid names look like {", ".join(EXAMPLE_TOPOLOGIES)}'


def tpu_spec(topology: str) -> TpuSpec:
  """The TpuSpec of 'GEN:AxB[xC]'; raises TopologyError for a name of another form."""
  match = re.fullmatch(r'(v\d+[a-z]?):(\d+(?:x\d+){1,2})', topology)
  if not match or match.group(1) not in TPU_SPECS:
    raise TopologyError(f'--topology={topology!r} is not a known TPU topology; '
                        f'{_topology_help()}.')
  return TPU_SPECS[match.group(1)]


def topology_devices(topology: str, num_slices: int = 1) -> list:
  """libtpu's compile-only devices of `num_slices` slices of `topology`."""
  spec = tpu_spec(topology)
  if num_slices < 1:
    raise TopologyError(f'--num_slices={num_slices} must be >= 1.')
  if importlib.util.find_spec('libtpu') is None:
    raise TopologyError('libtpu is not installed; pip install "jax[tpu]" at the version of jax.')
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    description = topologies.get_topology_desc(
        platform='tpu', topology_name=topology, chip_config_name=spec.chip_config,
        num_slices=num_slices)
  except Exception as e:  # pylint: disable=broad-except
    # JaxRuntimeError, e.g. for a shape that does not tile into hosts.
    raise TopologyError(f'--topology={topology!r}: libtpu cannot describe it '
                        f'({str(e).splitlines()[0]}); {_topology_help()}.') from e
  devices = list(description.devices)
  if devices[0].device_kind != spec.device_kind:
    raise TopologyError(f'--topology={topology!r} gave {devices[0].device_kind!r} devices, '
                        f'not {spec.device_kind!r}; update aot.TPU_SPECS.')
  return devices


def prepare_config(config, num_slices: int):
  """The config with dcn_data from --num_slices, validated as a training run would be."""
  from bert_jax import config_lib  # pylint: disable=g-import-not-at-top
  config = copy.deepcopy(config)
  if config.mesh.dcn_data not in (1, num_slices):
    raise config_lib.ConfigError(
        f'config.mesh.dcn_data={config.mesh.dcn_data} contradicts --num_slices={num_slices}; '
        'set --num_slices alone.')
  config.mesh.dcn_data = num_slices
  # The step compiled is the full batch's: a batch-size warmup's smaller ones are not.
  config.train.batch_warmup_rows = config.train.batch_warmup_tokens = 0
  checked = copy.deepcopy(config)
  checked.data.corpus = checked.data.corpus or 'builtin'  # No corpus is read here.
  config_lib.validate(checked)
  return config


class HbmExhaustedError(RuntimeError):
  """libtpu refused the step: its buffers exceed one device's HBM."""


def compile_train_step(config, mesh):
  """(compiled train step, compile seconds), lowered as pretrain.py runs it."""
  from bert_jax.train import step as steps  # pylint: disable=g-import-not-at-top
  logging.info('Compiling the %d-layer step (scan_layers=%s).', config.model.num_layers,
               config.model.scan_layers)
  start = time.perf_counter()
  lowered = steps.lower_pretraining_step(config, mesh)
  try:
    compiled = lowered.compile()
  except Exception as e:  # pylint: disable=broad-except
    if 'RESOURCE_EXHAUSTED' not in str(e):
      raise
    raise HbmExhaustedError(str(e).splitlines()[0]) from e
  seconds = time.perf_counter() - start
  logging.info('Compiled in %.0f s.', seconds)
  return compiled, seconds


def memory_report(compiled) -> dict:
  """Per-device bytes from XLA's buffer assignment; total as the module docstring defines."""
  stats = compiled.memory_analysis()
  fields = {'argument_bytes': stats.argument_size_in_bytes,
            'output_bytes': stats.output_size_in_bytes,
            'temp_bytes': stats.temp_size_in_bytes,
            'generated_code_bytes': stats.generated_code_size_in_bytes,
            'alias_bytes': stats.alias_size_in_bytes}
  fields['total_bytes'] = (fields['argument_bytes'] + fields['output_bytes'] + fields['temp_bytes']
                           + fields['generated_code_bytes'] - fields['alias_bytes'])
  fields['xla_peak_bytes'] = getattr(stats, 'peak_memory_in_bytes', None)
  return fields


def xla_cost(compiled) -> dict:
  """FLOPs, bytes accessed and optimal_seconds of one device's program (libtpu's analysis), and
  the part of the FLOPs and bytes its Mosaic kernels declare (kernel_costs)."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  seconds = cost.get('optimal_seconds')  # Negative (v4) when libtpu has no estimate.
  text = compiled.as_text()
  return {'flops': float(cost.get('flops', 0.0)), 'bytes': float(cost.get('bytes accessed', 0.0)),
          'seconds': float(seconds) if seconds and seconds > 0 else None,
          **kernel_costs.kernel_cost(text), 'parts': step_parts.step_parts(text)}


def probe_config(config, num_layers: int):
  """The same step with `num_layers` unrolled layers: XLA costs every layer it sees."""
  probe = copy.deepcopy(config)
  probe.model.update(num_layers=num_layers, scan_layers=False)
  return probe


def layer_cost(config, mesh) -> dict:
  """Per-device cost with every layer counted, from 1- and 2-layer unrolled probes.

  XLA's cost analysis counts a while loop's body once, so under nn.scan it sees one layer (and
  one backward layer) of num_layers. The step's cost is linear in layers: c(L) = c(1) +
  (L - 1) * (c(2) - c(1)), where the difference is one layer's forward, backward, gradient
  reduction and optimizer update.
  """
  start = time.perf_counter()
  one, two = (xla_cost(compile_train_step(probe_config(config, n), mesh)[0]) for n in (1, 2))
  extra = config.model.num_layers - 1
  cost = {'parts': step_parts.combine(one.pop('parts'), two.pop('parts'), extra)}
  for key in one:
    known = one[key] is not None and two[key] is not None
    cost[key] = one[key] + extra * (two[key] - one[key]) if known else None
    cost[f'{key}_per_layer'] = two[key] - one[key] if known else None
  cost['compile_s'] = round(time.perf_counter() - start, 1)
  return cost


def cost_report(config, compiled, mesh, spec: TpuSpec, probes: bool) -> dict:
  """Per-device FLOPs, bytes and step time: XLA's, with scanned layers counted via probes."""
  cost = xla_cost(compiled)
  report = {'xla_flops_per_device': cost['flops'], 'xla_bytes_per_device': cost['bytes'],
            'xla_optimal_seconds': cost['seconds'],
            'xla_kernel_flops_per_device': cost['kernel_flops'],
            'xla_kernel_bytes_per_device': cost['kernel_bytes']}
  note = ''
  if config.model.scan_layers and config.model.num_layers > 1:
    if probes:
      cost = report['layer_probes'] = layer_cost(config, mesh)
      note = ', 1- and 2-layer unrolled probes extrapolated to all layers'
    else:
      note = ', the scanned layer counted once (an underestimate)'
  roofline = max(cost['flops'] / (spec.peak_tflops * 1e12), cost['bytes'] / (spec.hbm_gbps * 1e9))
  if cost['seconds'] is not None:
    seconds, source = cost['seconds'], 'xla optimal_seconds' + note
  else:
    seconds, source = roofline, 'roofline max(flops/peak, bytes/HBM bandwidth)' + note
  report.update(flops_per_device=cost['flops'], bytes_per_device=cost['bytes'],
                roofline_s=roofline, step_time_s=seconds, step_time_source=source)
  # The split of the estimate between what XLA costs itself and what the kernels declare.
  flops_without = cost['flops'] - cost['kernel_flops']
  bytes_without = cost['bytes'] - cost['kernel_bytes']
  report.update(
      kernel_calls_per_device=round(cost['kernel_calls']),
      kernel_flops_per_device=cost['kernel_flops'], kernel_bytes_per_device=cost['kernel_bytes'],
      kernel_flops_share=cost['kernel_flops'] / cost['flops'] if cost['flops'] else 0.0,
      kernel_roofline_s=max(cost['kernel_flops'] / (spec.peak_tflops * 1e12),
                            cost['kernel_bytes'] / (spec.hbm_gbps * 1e9)),
      flops_without_kernels_per_device=flops_without,
      bytes_without_kernels_per_device=bytes_without,
      roofline_without_kernels_s=max(flops_without / (spec.peak_tflops * 1e12),
                                     bytes_without / (spec.hbm_gbps * 1e9)))
  parts = cost['parts']
  report.update(
      bytes_by_part={name: part['bytes'] for name, part in parts.items()},
      bytes_by_part_share=step_parts.shares(parts, 'bytes'),
      bytes_by_part_coverage=(step_parts.summed(parts, 'bytes') / cost['bytes']
                              if cost['bytes'] else 0.0),
      cycles_by_part_share=step_parts.shares(parts, 'cycles'))
  return report


def parameter_count(config) -> int:
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax.train import optim  # pylint: disable=g-import-not-at-top
  from bert_jax.train import step as steps  # pylint: disable=g-import-not-at-top
  state = steps.abstract_train_state(config, steps.build_model(config),
                                     optim.for_pretraining(config))
  return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(state.params))


def _describe(topology: str, num_slices: int, spec: TpuSpec, num_devices: int) -> str:
  slices = f' x {num_slices} slices' if num_slices > 1 else ''
  cores = ' (one per core)' if spec.devices_per_chip > 1 else ''
  return f'--topology={topology}{slices} has {num_devices} {spec.device_kind} devices{cores}'


def analyze(config, topology: str, num_slices: int = 1, probes: bool = True) -> dict:
  """Validates, compiles and summarises; raises ConfigError/MeshError/TopologyError first."""
  from bert_jax import config_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.train import metrics  # pylint: disable=g-import-not-at-top
  from bert_jax.train import optim  # pylint: disable=g-import-not-at-top
  from bert_jax import sharding  # pylint: disable=g-import-not-at-top
  from bert_jax.train import step as steps  # pylint: disable=g-import-not-at-top
  from bert_jax.ops import checks  # pylint: disable=g-import-not-at-top
  config = prepare_config(config, num_slices)
  spec = tpu_spec(topology)
  checks.check_tpu_kernels(config, spec.device_kind)
  devices = topology_devices(topology, num_slices)
  try:
    mesh = sharding.create_mesh(config.mesh, devices)
    steps.check_state_divides(config, steps.build_model(config),
                              optim.for_pretraining(config), mesh,
                              sharding.logical_axis_rules(config.mesh.preset))
  except sharding.MeshError as e:
    raise sharding.MeshError(f'{_describe(topology, num_slices, spec, len(devices))}: {e}') from e
  config_lib.validate_runtime(config, config.model.vocab_size, sharding.batch_divisor(mesh))
  n = len(devices)
  report = {
      'topology': topology, 'num_slices': num_slices, 'device_kind': spec.device_kind,
      'num_devices': n, 'num_chips': n // spec.devices_per_chip,
      'mesh': {k: int(v) for k, v in mesh.shape.items()}, 'preset': config.mesh.preset,
      'remat_policy': config.model.remat_policy, 'dtype': config.model.dtype,
      'scan_layers': config.model.scan_layers, 'parameters': parameter_count(config),
      'batch': config.train.batch_size, 'seq': config.data.max_seq_length,
      'predictions': config.data.max_predictions_per_seq,
      'hbm_per_device_gib': spec.hbm_gib,
      'peak_tflops_per_chip': spec.peak_tflops * spec.devices_per_chip,
  }
  try:
    compiled, compile_s = compile_train_step(config, mesh)
  except HbmExhaustedError as e:
    return {**report, 'fits': False, 'out_of_memory': str(e)}
  memory = memory_report(compiled)
  needed = max(memory['total_bytes'], memory['xla_peak_bytes'] or 0)
  cost = cost_report(config, compiled, mesh, spec, probes)
  model_flops = metrics.model_flops_per_sequence(config) * config.train.batch_size
  return {
      **report, 'memory_per_device': memory, 'needed_gib': round(needed / GiB, 3),
      'fits': needed <= spec.hbm_gib * GiB, **cost,
      'flops_per_step': cost['flops_per_device'] * n, 'model_flops_per_step': model_flops,
      'mfu': model_flops / (cost['step_time_s'] * n * spec.peak_tflops * 1e12),
      'compile_s': round(compile_s, 1),
  }


def _compile_only_environment() -> None:
  """Before JAX loads: run on CPU, and let libtpu load beside other processes that hold it.

  libtpu takes /tmp/libtpu_lockfile when it loads; without the override, a second process on
  the host (a training run on a TPU VM, or another JAX process on a CPU machine with libtpu
  installed) makes the topology call fail. This process only compiles, it claims no chips.
  """
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  chips.quiet_absent_tpu(compile_only=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  _compile_only_environment()
  from bert_jax import config_lib  # pylint: disable=g-import-not-at-top
  from bert_jax import sharding  # pylint: disable=g-import-not-at-top
  try:
    report = analyze(_CONFIG.value, _TOPOLOGY.value, _NUM_SLICES.value, _PROBES.value)
  except (config_lib.ConfigError, sharding.MeshError, TopologyError) as e:
    sys.exit(f'Invalid AOT setup: {e}')
  print(json.dumps(report), flush=True)
  if not report['fits']:
    sys.exit(2)  # The JSON says why; scripts can test the status.


def run_command():
  app.run(main, flags_parser=cli.flags_parser(__name__))


if __name__ == '__main__':
  run_command()
