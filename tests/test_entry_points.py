"""The commands' shared start: --help lists the config keys, a missing config file is one line,
and libtpu stays quiet on a machine without a TPU."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from bert_jax.core import chips

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Each command's other required flags.
COMMANDS = {'bert_jax.main': ['--workdir=WORKDIR'], 'bert_jax.aot': ['--topology=v4:2x2x1'],
            'bert_jax.benchmark': [], 'bert_jax.data.prepare': ['--output=WORKDIR']}


def run(*args, cwd=REPO, env=None):
  return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                        timeout=120, env=env, check=False)


@pytest.mark.parametrize('help_flag', ['--help', '--helpshort'])
def test_help_lists_flags_then_config_keys_with_defaults(help_flag):
  result = run('-m', 'bert_jax.main', help_flag)
  assert result.returncode == 0, result.stderr
  out = result.stdout
  assert '--workdir' in out
  assert out.index('--workdir') < out.index('config keys of configs/base.py')
  assert "  train.warmup_steps = 10000 " in out
  assert "  model.hidden_size = 768 " in out and ' H.' in out
  # A key a family unit declares (models/deberta/config.py) has its doc too.
  assert re.search(r'  model.relative_buckets = 0 +Log buckets of the relative distances', out)
  assert 'configs/tiny.py' in out
  # Descriptions are whole, wrapped in their column, never cut.
  keys = out[out.index('config keys of'):]
  assert not [line for line in keys.splitlines() if line.endswith('...')]
  assert re.search(r'\n {53}\(bert_jax/tools/equivalence.py\'s yardstick\)\.\n', keys)


def test_help_lists_the_keys_of_the_given_config():
  result = run('-m', 'bert_jax.main', '--config=configs/glue.py:task=mrpc', '--help')
  assert result.returncode == 0, result.stderr
  assert "  task.name = 'mrpc'" in result.stdout
  assert "  mode = 'finetune'" in result.stdout


@pytest.mark.parametrize('command', COMMANDS)
def test_a_missing_config_file_is_one_line_naming_it_and_the_configs(command, tmp_path):
  others = [arg.replace('WORKDIR', str(tmp_path)) for arg in COMMANDS[command]]
  result = run('-m', command, '--config=configs/nope.py', *others)
  assert result.returncode == 1
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1, result.stderr
  assert "Config file 'configs/nope.py' does not exist" in lines[0]
  assert 'configs/base.py' in lines[0] and 'configs/tiny.py' in lines[0]
  assert 'Traceback' not in result.stderr


@pytest.mark.parametrize('args, says', [
    (['-m', 'bert_jax.main', '--config=configs/tiny.py', '--config.model.hiden_size=3',
      '--workdir=WORKDIR'],
     "--config.model.hiden_size=3: configs/tiny.py has no key 'model.hiden_size' (did you mean "
     "'model.hidden_size'?)"),
    (['-m', 'bert_jax.sweep', 'check', '--sweep=sweeps/masking_rate.py',
      '--sweep.finetune.overrides.task.max_train_examples=64'],
     "sweeps/masking_rate.py has no key 'finetune.overrides.task.max_train_examples' "
     '(finetune.overrides.task has: write_predictions)'),
    (['-m', 'bert_jax.main', '--config=configs/tiny.py', '--config.seed.x=3',
      '--workdir=WORKDIR'], "no key 'seed.x' (seed is a value, not a group)"),
])
def test_an_override_of_a_key_the_file_lacks_is_one_line_naming_it(args, says, tmp_path):
  result = run(*[arg.replace('WORKDIR', str(tmp_path)) for arg in args])
  assert result.returncode == 1
  lines = result.stderr.strip().splitlines()
  assert lines[-1].startswith('Invalid config override: ') and says in lines[-1], result.stderr
  assert 'Traceback' not in result.stderr


def test_a_config_file_that_does_not_load_is_one_line(tmp_path):
  broken = tmp_path / 'broken.py'
  broken.write_text('def get_config(:\n', encoding='utf-8')
  result = run('-m', 'bert_jax.main', f'--config={broken}', f'--workdir={tmp_path}')
  assert result.returncode == 1
  assert result.stderr.strip().startswith(f'Config file {str(broken)!r} does not load:')
  assert len(result.stderr.strip().splitlines()) == 1, result.stderr


needs_libtpu_without_tpu = pytest.mark.skipif(
    importlib.util.find_spec('libtpu') is None or chips.tpu_attached(),
    reason='libtpu is not installed, or a TPU is attached: nothing to quiet')


def _without_tpu_settings():
  return {k: v for k, v in os.environ.items()
          if not k.startswith('TPU_') and k != 'JAX_PLATFORMS'}


@needs_libtpu_without_tpu
def test_libtpu_is_quiet_on_a_machine_without_a_tpu():
  result = run('-c', 'from bert_jax.core import chips; chips.quiet_absent_tpu(); import jax; '
               'print(jax.devices()[0].platform)', env=_without_tpu_settings())
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() in ('cpu', 'gpu')
  assert 'TPU' not in result.stderr and 'libtpu' not in result.stderr, result.stderr


@needs_libtpu_without_tpu
def test_compile_only_still_describes_tpu_topologies_quietly():
  # As bert_jax.aot starts; other processes may hold libtpu.
  code = ('import os; os.environ["JAX_PLATFORMS"] = "cpu"\n'
          'os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"\n'
          'from bert_jax.core import chips; chips.quiet_absent_tpu(compile_only=True)\n'
          'from jax.experimental import topologies\n'
          'd = topologies.get_topology_desc(platform="tpu", topology_name="v4:2x2x4", '
          'chip_config_name="megacore", num_slices=1)\n'
          'print(len(d.devices), len({x.process_index for x in d.devices}))\n')
  result = run('-c', code, env=_without_tpu_settings())
  assert result.returncode == 0, result.stderr
  assert result.stdout.split() == ['16', '4']  # 16 chips on 4 hosts.
  assert 'TPU' not in result.stderr and 'Error' not in result.stderr, result.stderr


def test_a_config_file_with_arguments_passes_the_file_check():
  code = ('from absl import flags; from ml_collections import config_flags\n'
          'from bert_jax.core import cli\n'
          'config_flags.DEFINE_config_file("config")\n'
          'flags.FLAGS(["x", "--config=configs/tiny.py:steps=2,nsp=False"])\n'
          'cli.check_config_loads(flags.FLAGS["config"]); print("loaded")\n')
  result = run('-c', code)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == 'loaded'


def test_a_step_that_does_not_fit_the_device_is_one_line_naming_what_shrinks_it(tmp_path):
  # The allocation fails where XLA runs the step; a fake one stands in for a device's.
  code = ('import sys, jax\n'
          'from absl import app\n'
          'from bert_jax import main\n'
          'from bert_jax.train import pretrain\n'
          'def no_memory(*args, **kwargs):\n'
          '  raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to "\n'
          '                                   "allocate 17179869184 bytes.\\nBufferAssignment: ...")\n'
          'pretrain.train_and_evaluate = no_memory\n'
          f'sys.argv = ["main", "--config=configs/tiny.py", "--workdir={tmp_path / "w"}"]\n'
          'app.run(main.main, flags_parser=main.cli.flags_parser("bert_jax.main"))\n')
  result = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False)
  assert result.returncode == 1 and 'Traceback' not in result.stderr, result.stderr[-3000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith('Out of device memory: RESOURCE_EXHAUSTED: Out of memory while trying '
                         'to allocate 17179869184 bytes. The step'), last
  assert 'config.train.grad_accum_steps=2' in last and "config.mesh.preset='fsdp'" in last
  assert result.stderr.count('Out of device memory') == 1  # Once, not also as a log record.


def test_an_invalid_config_is_said_once_as_the_last_line(tmp_path):
  result = run('-m', 'bert_jax.main', '--config=configs/tiny.py', f'--workdir={tmp_path / "w"}',
               '--config.train.num_steps=0')
  assert result.returncode == 1 and 'Traceback' not in result.stderr, result.stderr[-3000:]
  assert result.stderr.strip().splitlines()[-1].startswith(
      'Invalid config: config.train.num_steps=0')
  assert result.stderr.count('config.train.num_steps=0') == 1, result.stderr[-3000:]


LATE_CALLBACK = '''
import asyncio, sys
sys.path.insert(0, {repo!r})
from bert_jax.core import errors
if {quiet}:
  errors.quiet_closed_loop_echoes()
loop = asyncio.new_event_loop()
loop.close()
class Late:  # As tensorstore's callback of an abandoned read: it fires on a closed loop.
  def __del__(self):
    loop.call_soon_threadsafe(print)
class Other:
  def __del__(self):
    raise ValueError('an unrelated unraisable error')
Late()
Other()
print('done')
'''


@pytest.mark.parametrize('quiet', [False, True])
def test_commands_drop_only_the_closed_loop_echoes_of_abandoned_reads(quiet):
  result = run('-c', LATE_CALLBACK.format(repo=REPO, quiet=quiet))
  assert result.returncode == 0 and result.stdout.strip() == 'done', result.stderr
  assert ('RuntimeError: Event loop is closed' in result.stderr) == (not quiet), result.stderr
  assert 'ValueError: an unrelated unraisable error' in result.stderr
