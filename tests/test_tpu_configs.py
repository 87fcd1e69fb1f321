"""configs/tpu.py: the paper's BERT-Base and BERT-Large laid out for each TPU generation."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax import config_lib  # noqa: E402
from bert_jax.ops import checks  # noqa: E402
from configs import base  # noqa: E402
from configs import large  # noqa: E402
from configs import tpu  # noqa: E402


@pytest.mark.parametrize('gen', tpu.GENERATIONS)
@pytest.mark.parametrize('size', tpu.SIZES)
@pytest.mark.parametrize('seq', tpu.SEQS)
def test_every_generation_keeps_the_papers_model_data_and_optimizer(gen, size, seq):
  config = tpu.get_config(f'gen={gen},size={size},seq={seq}')
  paper = (large if size == 'large' else base).get_config()
  for key in ('num_layers', 'hidden_size', 'num_heads', 'intermediate_size',
              'hidden_dropout_rate', 'attention_dropout_rate', 'param_dtype', 'gelu'):
    assert config.model[key] == paper.model[key], key
  assert config.train.to_dict() == paper.train.to_dict()
  assert config.objectives == paper.objectives and config.masking == paper.masking
  assert (config.data.max_seq_length, config.data.max_predictions_per_seq) == (
      (128, 20) if seq == 128 else (512, 80))
  # How the step is computed and laid out: the generation's choice.
  assert (config.model.dtype, config.model.attention_impl) == (
      'bfloat16', 'xla' if gen == 'v3' else 'tpu')
  choice = tpu.SLICES[(gen, size, seq)]
  assert choice.topology.startswith(f'{gen}:')
  assert (config.mesh.preset, config.model.remat_policy) == (choice.preset, choice.remat_policy)
  checked = config.copy_and_resolve_references()
  checked.data.corpus = 'builtin'
  config_lib.validate(checked)


def test_pretraining_arguments_pass_through():
  config = tpu.get_config('gen=v4,size=base,seq=128,steps=1000,nsp=False')
  assert (config.train.num_steps, config.train.warmup_steps) == (1000, 10)
  assert config.objectives == 'mlm' and config.model.num_layers == 12


@pytest.mark.parametrize('arg,message', [
    ('gen=v2', "gen='v2'; valid: v3, v4, v5e, v5p, v6e"),
    ('size=huge', "size='huge'; valid: base, large"),
    ('seq=256', "seq='256' has no TPU settings; valid: 128, 512"),
    ('layerz=3', 'Unknown config argument'),
])
def test_bad_arguments_name_the_valid_ones(arg, message):
  with pytest.raises(ValueError, match=message.replace('(', r'\(').replace(')', r'\)')):
    tpu.get_config(arg)


def test_the_tpu_attention_on_v3_is_refused_naming_the_generation():
  config = tpu.get_config('gen=v4,size=base,seq=128')
  checks.check_tpu_kernels(config, 'TPU v4')
  with pytest.raises(config_lib.ConfigError, match=r"attention_impl='tpu'.*TPU v3 devices"):
    checks.check_tpu_kernels(config, 'TPU v3')
  checks.check_tpu_kernels(tpu.get_config('gen=v3,size=base,seq=128'), 'TPU v3')  # 'xla'.
  config.model.dtype = 'float32'  # Mosaic compiles the kernels' float32 matmuls for v3.
  checks.check_tpu_kernels(config, 'TPU v3')
