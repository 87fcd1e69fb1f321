"""Original TF BERT checkpoints: read without TensorFlow, files written by real TensorFlow.

TensorFlow writes the fixtures (tf.raw_ops.SaveV2, the op behind tf.train.Saver) in a
subprocess, so the reader is checked against the real format and TF stays out of this process.
"""

import importlib.util
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.interop import tf_checkpoint

TINY = {'vocab_size': 11, 'hidden_size': 8, 'num_hidden_layers': 2, 'num_attention_heads': 2,
        'intermediate_size': 12, 'max_position_embeddings': 16, 'type_vocab_size': 2,
        'hidden_act': 'gelu', 'hidden_dropout_prob': 0.1, 'attention_probs_dropout_prob': 0.1,
        'initializer_range': 0.02}

_WRITER = """
import pickle, sys
import tensorflow as tf
checkpoints, merges = pickle.load(sys.stdin.buffer)
for prefix, tensors in checkpoints.items():
  names = sorted(tensors)
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[''] * len(names),
                    tensors=[tf.constant(tensors[n]) for n in names])
for destination, prefixes in merges.items():  # As a sharded tf.train.Saver does.
  tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=prefixes, destination_prefix=destination)
"""


def require_tensorflow() -> None:
  """Skips without tensorflow; fails instead if BERT_JAX_REQUIRE_DATA=1 (as in CI)."""
  if importlib.util.find_spec('tensorflow') is not None:
    return
  reason = 'tensorflow is not installed; it writes the real-format checkpoint fixtures.'
  if os.environ.get('BERT_JAX_REQUIRE_DATA') == '1':
    pytest.fail(f'BERT_JAX_REQUIRE_DATA=1 but {reason}')
  pytest.skip(reason)


def write_with_tf(checkpoints: dict[str, dict[str, np.ndarray]],
                  merges: dict[str, list[str]] | None = None) -> None:
  """Saves {prefix: {name: array}} with TF's SaveV2, then merges {dest: prefixes} into shards."""
  require_tensorflow()
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', CUDA_VISIBLE_DEVICES='')
  result = subprocess.run([sys.executable, '-c', _WRITER],
                          input=pickle.dumps((checkpoints, merges or {})),
                          capture_output=True, env=env, timeout=300, check=False)
  assert result.returncode == 0, result.stderr.decode()[-3000:]


def bert_tf_variables(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
  """Random weights under the original google-research/bert variable names and shapes."""
  rng = np.random.default_rng(seed)
  h, f, v = config['hidden_size'], config['intermediate_size'], config['vocab_size']
  shapes = {
      'bert/embeddings/word_embeddings': (v, h),
      'bert/embeddings/position_embeddings': (config['max_position_embeddings'], h),
      'bert/embeddings/token_type_embeddings': (config['type_vocab_size'], h),
      'bert/embeddings/LayerNorm/gamma': (h,), 'bert/embeddings/LayerNorm/beta': (h,),
      'bert/pooler/dense/kernel': (h, h), 'bert/pooler/dense/bias': (h,),
      'cls/predictions/transform/dense/kernel': (h, h),
      'cls/predictions/transform/dense/bias': (h,),
      'cls/predictions/transform/LayerNorm/gamma': (h,),
      'cls/predictions/transform/LayerNorm/beta': (h,),
      'cls/predictions/output_bias': (v,),
      'cls/seq_relationship/output_weights': (2, h), 'cls/seq_relationship/output_bias': (2,),
  }
  for i in range(config['num_hidden_layers']):
    p = f'bert/encoder/layer_{i}/'
    for qkv in ('query', 'key', 'value'):
      shapes.update({f'{p}attention/self/{qkv}/kernel': (h, h),
                     f'{p}attention/self/{qkv}/bias': (h,)})
    shapes.update({
        f'{p}attention/output/dense/kernel': (h, h), f'{p}attention/output/dense/bias': (h,),
        f'{p}attention/output/LayerNorm/gamma': (h,), f'{p}attention/output/LayerNorm/beta': (h,),
        f'{p}intermediate/dense/kernel': (h, f), f'{p}intermediate/dense/bias': (f,),
        f'{p}output/dense/kernel': (f, h), f'{p}output/dense/bias': (h,),
        f'{p}output/LayerNorm/gamma': (h,), f'{p}output/LayerNorm/beta': (h,),
    })
  return {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}


def with_training_state(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Adds what the original run_pretraining.py saves besides weights: step and Adam slots."""
  out = dict(weights, global_step=np.array(12345, np.int64))
  for name, value in weights.items():
    out[f'{name}/adam_m'] = value * 0.5
    out[f'{name}/adam_v'] = value * value
  return out


@pytest.fixture(scope='module')
def checkpoints(tmp_path_factory):
  """Real TF checkpoints: a tiny BERT with training state, and one of assorted dtypes."""
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp('tf_ckpt')
  bert = with_training_state(bert_tf_variables(TINY))
  rng = np.random.default_rng(1)
  dtypes = {
      'f64': rng.normal(size=(3, 2)), 'f16': rng.normal(size=(5,)).astype(np.float16),
      'bf16': rng.normal(size=(2, 2)).astype(ml_dtypes.bfloat16),
      'i32': np.arange(-3, 3, dtype=np.int32).reshape(2, 3), 'i8': np.array([-1, 7], np.int8),
      'u8': np.array([0, 255], np.uint8), 'bool': np.array([True, False, True]),
      'scalar': np.array(2.5, np.float32), 'empty': np.zeros((0, 3), np.float32),
      'big/w': rng.normal(size=(300, 257)).astype(np.float32),  # Many crc lanes, odd tail.
  }
  names = sorted(bert)
  halves = {str(root / 'parts' / 'a'): {n: bert[n] for n in names[::2]},
            str(root / 'parts' / 'b'): {n: bert[n] for n in names[1::2]}}
  write_with_tf({str(root / 'bert' / 'bert_model.ckpt'): bert,
                 str(root / 'dtypes' / 'ckpt'): dtypes,
                 str(root / 'strings' / 'ckpt'): {'s': np.array([b'a', b'bc'])}, **halves},
                merges={str(root / 'sharded' / 'ckpt'): list(halves)})
  with open(root / 'bert' / 'bert_config.json', 'w', encoding='utf-8') as f:
    json.dump(TINY, f)
  return {'root': root, 'bert': (str(root / 'bert' / 'bert_model.ckpt'), bert),
          'dtypes': (str(root / 'dtypes' / 'ckpt'), dtypes),
          'sharded': (str(root / 'sharded' / 'ckpt'), bert)}


def copy_checkpoint(prefix: str, dest) -> str:
  """A copy of a checkpoint (index, data, config) in dest, to corrupt without side effects."""
  src = os.path.dirname(prefix)
  os.makedirs(dest, exist_ok=True)
  for name in os.listdir(src):
    with open(os.path.join(src, name), 'rb') as f_in, open(dest / name, 'wb') as f_out:
      f_out.write(f_in.read())
  return str(dest / os.path.basename(prefix))


# --- reading ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize('which', ['bert', 'dtypes', 'sharded'])
def test_reads_back_exactly_what_tensorflow_saved(checkpoints, which):
  prefix, expected = checkpoints[which]
  got = tf_checkpoint.read_tf_checkpoint(prefix)
  assert sorted(got) == sorted(expected)
  for name, value in expected.items():
    assert got[name].dtype == value.dtype, name
    assert got[name].shape == value.shape, name
    assert np.array_equal(got[name], value), name


@pytest.mark.slow
def test_sharded_checkpoint_is_spread_over_its_data_files(checkpoints):
  root = checkpoints['root'] / 'sharded'
  assert sorted(os.listdir(root)) == ['ckpt.data-00000-of-00002', 'ckpt.data-00001-of-00002',
                                      'ckpt.index']


@pytest.mark.slow
def test_reading_without_checksums_gives_the_same_arrays(checkpoints):
  prefix, expected = checkpoints['bert']
  got = tf_checkpoint.read_tf_checkpoint(prefix, verify_checksums=False)
  assert got['global_step'].dtype == np.int64 and got['global_step'] == 12345
  assert all(np.array_equal(got[n], v) for n, v in expected.items())


def test_unsupported_dtype_is_named(checkpoints):
  with pytest.raises(ValueError, match=r"'s' has unsupported dtype DT_STRING \(7\)"):
    tf_checkpoint.read_tf_checkpoint(str(checkpoints['root'] / 'strings' / 'ckpt'))


def test_missing_files_are_named(checkpoints, tmp_path):
  with pytest.raises(FileNotFoundError, match=r'missing .*nothing\.index'):
    tf_checkpoint.read_tf_checkpoint(str(tmp_path / 'nothing'))
  prefix = copy_checkpoint(checkpoints['bert'][0], tmp_path / 'no_data')
  os.remove(prefix + '.data-00000-of-00001')
  with pytest.raises(FileNotFoundError, match=r'missing data file .*data-00000-of-00001'):
    tf_checkpoint.read_tf_checkpoint(prefix)
  prefix = copy_checkpoint(checkpoints['bert'][0], tmp_path / 'no_config')
  os.remove(os.path.join(os.path.dirname(prefix), 'bert_config.json'))
  with pytest.raises(FileNotFoundError, match=r'missing .*bert_config\.json'):
    tf_checkpoint.load_tf_bert(prefix)


def test_truncated_data_file_is_reported(checkpoints, tmp_path):
  prefix = copy_checkpoint(checkpoints['bert'][0], tmp_path / 'ckpt')
  data = prefix + '.data-00000-of-00001'
  os.truncate(data, os.path.getsize(data) - 3)
  with pytest.raises(ValueError, match=r'data-00000-of-00001 is truncated: variable'):
    tf_checkpoint.read_tf_checkpoint(prefix)


def test_corrupted_data_byte_fails_the_checksum_of_its_variable(checkpoints, tmp_path):
  prefix, expected = checkpoints['bert']
  prefix = copy_checkpoint(prefix, tmp_path / 'ckpt')
  data = prefix + '.data-00000-of-00001'
  with open(data, 'rb') as f:
    content = bytearray(f.read())
  offset = content.find(expected['bert/pooler/dense/bias'].tobytes())  # Random, so unique.
  assert offset >= 0
  content[offset + 5] ^= 0x10
  with open(data, 'wb') as f:
    f.write(content)
  with pytest.raises(ValueError, match=r"checksum mismatch for variable 'bert/pooler/dense/bias'"):
    tf_checkpoint.read_tf_checkpoint(prefix)
  # Without verification the flipped bit goes through unnoticed, as documented.
  got = tf_checkpoint.read_tf_checkpoint(prefix, verify_checksums=False)
  assert not np.array_equal(got['bert/pooler/dense/bias'], expected['bert/pooler/dense/bias'])


def test_corrupted_index_is_reported(checkpoints, tmp_path):
  prefix = copy_checkpoint(checkpoints['bert'][0], tmp_path / 'ckpt')
  index = prefix + '.index'
  with open(index, 'rb') as f:
    content = bytearray(f.read())
  bad_magic = bytearray(content)
  bad_magic[-1] ^= 0xFF
  with open(index, 'wb') as f:
    f.write(bad_magic)
  with pytest.raises(ValueError, match=r'not a TF checkpoint index: no SSTable magic'):
    tf_checkpoint.read_tf_checkpoint(prefix)
  bad_block = bytearray(content)
  bad_block[20] ^= 0x01  # Inside the first data block: its block checksum catches it.
  with open(index, 'wb') as f:
    f.write(bad_block)
  with pytest.raises(ValueError, match=r'\.index is corrupted'):
    tf_checkpoint.read_tf_checkpoint(prefix)


def test_a_file_that_is_not_a_checkpoint_is_reported(tmp_path):
  (tmp_path / 'x.index').write_text('{"not": "an sstable"}' * 4)
  with pytest.raises(ValueError, match=r'x\.index is not a TF checkpoint index'):
    tf_checkpoint.read_tf_checkpoint(str(tmp_path / 'x'))


def test_crc32c_matches_known_values():
  assert tf_checkpoint.crc32c(b'') == 0
  assert tf_checkpoint.crc32c(b'123456789') == 0xE3069283  # The standard check value.
  assert tf_checkpoint.crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720 B.4 test vectors.
  assert tf_checkpoint.crc32c(b'\xff' * 32) == 0x62A8AB43
  assert tf_checkpoint.crc32c(bytes(range(32))) == 0x46DD794E


def test_crc32c_agrees_with_a_bitwise_reference_across_lane_counts():
  def reference(data):
    crc = 0xFFFFFFFF
    for byte in data:
      crc ^= byte
      for _ in range(8):
        crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF
  rng = np.random.default_rng(0)
  for size in (1, 3, 4, 5, 127, 128, 129, 1000, 4099, 40_001):
    data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    assert tf_checkpoint.crc32c(data) == reference(data), size


def test_snappy_blocks_decompress():
  # Length 10, literal 'ab', then a copy of 8 bytes from 2 back (overlapping its output).
  assert tf_checkpoint._snappy_decompress(b'\x0a\x04ab\x11\x02') == b'ab' * 5
  # Length 70, a 70-byte literal whose length follows the tag in one byte (tag 60 << 2).
  text = bytes(range(70))
  assert tf_checkpoint._snappy_decompress(b'\x46\xf0\x45' + text) == text
  with pytest.raises(ValueError, match='bad copy offset'):
    tf_checkpoint._snappy_decompress(b'\x05\x11\x02')


# --- mapping to HF names ------------------------------------------------------------------


def expected_hf_names(num_layers: int) -> set[str]:
  """BertForPreTraining's weight names, spelled out here independently of the table."""
  names = {f'bert.embeddings.{e}.weight' for e in
           ('word_embeddings', 'position_embeddings', 'token_type_embeddings')}
  names |= {'bert.embeddings.LayerNorm.weight', 'bert.embeddings.LayerNorm.bias',
            'bert.pooler.dense.weight', 'bert.pooler.dense.bias', 'cls.predictions.bias',
            'cls.predictions.transform.dense.weight', 'cls.predictions.transform.dense.bias',
            'cls.predictions.transform.LayerNorm.weight',
            'cls.predictions.transform.LayerNorm.bias',
            'cls.seq_relationship.weight', 'cls.seq_relationship.bias'}
  for i in range(num_layers):
    for module in ('attention.self.query', 'attention.self.key', 'attention.self.value',
                   'attention.output.dense', 'attention.output.LayerNorm',
                   'intermediate.dense', 'output.dense', 'output.LayerNorm'):
      names |= {f'bert.encoder.layer.{i}.{module}.weight', f'bert.encoder.layer.{i}.{module}.bias'}
  return names


def test_mapping_gives_hf_names_and_layouts(checkpoints):
  prefix, tf_vars = checkpoints['bert']
  state, config = tf_checkpoint.load_tf_bert(prefix)
  assert set(state) == expected_hf_names(2)
  np.testing.assert_array_equal(state['bert.encoder.layer.1.attention.self.query.weight'],
                                tf_vars['bert/encoder/layer_1/attention/self/query/kernel'].T)
  np.testing.assert_array_equal(state['bert.encoder.layer.0.intermediate.dense.weight'],
                                tf_vars['bert/encoder/layer_0/intermediate/dense/kernel'].T)
  assert state['bert.encoder.layer.0.output.dense.weight'].shape == (8, 12)
  np.testing.assert_array_equal(state['cls.seq_relationship.weight'],
                                tf_vars['cls/seq_relationship/output_weights'])  # Not transposed.
  np.testing.assert_array_equal(state['cls.predictions.bias'],
                                tf_vars['cls/predictions/output_bias'])
  np.testing.assert_array_equal(state['bert.encoder.layer.1.output.LayerNorm.weight'],
                                tf_vars['bert/encoder/layer_1/output/LayerNorm/gamma'])
  np.testing.assert_array_equal(state['bert.embeddings.word_embeddings.weight'],
                                tf_vars['bert/embeddings/word_embeddings'])
  assert config == dict(TINY, model_type='bert', layer_norm_eps=1e-12)


def test_unknown_names_are_all_listed():
  tf_vars = bert_tf_variables(TINY)
  tf_vars.update({'bert/encoder/layer_0/mystery/kernel': np.zeros(1),
                  'cls/extra_head/weights': np.zeros(1),
                  'global_step': np.zeros((), np.int64), 'bert/pooler/dense/bias/adam_m': 0})
  with pytest.raises(ValueError) as e:
    tf_checkpoint.tf_to_hf_state_dict(tf_vars)
  message = str(e.value)
  assert '2 TF variables have no BERT mapping' in message
  assert 'bert/encoder/layer_0/mystery/kernel' in message and 'cls/extra_head/weights' in message


def test_config_conversion_fills_original_defaults_and_checks_required_keys():
  minimal = {k: TINY[k] for k in ('vocab_size', 'hidden_size', 'num_hidden_layers',
                                  'num_attention_heads', 'intermediate_size')}
  config = tf_checkpoint.tf_config_to_hf_config(dict(minimal, pooler_type='first_token'))
  assert config['type_vocab_size'] == 16  # The original BertConfig's default, not HF's 2.
  assert config['model_type'] == 'bert' and 'pooler_type' not in config
  with pytest.raises(ValueError, match='lacks hidden_size, intermediate_size'):
    tf_checkpoint.tf_config_to_hf_config({'vocab_size': 3, 'num_hidden_layers': 1,
                                          'num_attention_heads': 1})


def test_config_that_does_not_match_the_checkpoint_is_reported(checkpoints, tmp_path):
  prefix = copy_checkpoint(checkpoints['bert'][0], tmp_path / 'ckpt')
  with open(tmp_path / 'ckpt' / 'bert_config.json', 'w', encoding='utf-8') as f:
    json.dump(dict(TINY, vocab_size=30522), f)
  with pytest.raises(ValueError, match='word_embeddings.weight has shape'):
    tf_checkpoint.load_tf_bert(prefix)


# --- against transformers -----------------------------------------------------------------


def original_bert_forward(w: dict[str, np.ndarray], config: dict, ids, types):
  """MLM logits and NSP logits of google-research/bert's modeling.py, in numpy, TF layout."""
  import math  # pylint: disable=g-import-not-at-top
  erf = np.vectorize(math.erf)

  def layer_norm(x, prefix):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-12) * w[prefix + '/gamma'] + w[prefix + '/beta']

  def dense(x, prefix):
    return x @ w[prefix + '/kernel'] + w[prefix + '/bias']

  def gelu(x):
    # The exact (erf) GELU, as HF's and ours; modeling.py itself used the tanh approximation.
    return 0.5 * x * (1 + erf(x / np.sqrt(2)))

  e = 'bert/embeddings/'
  x = (w[e + 'word_embeddings'][ids] + w[e + 'token_type_embeddings'][types]
       + w[e + 'position_embeddings'][np.arange(ids.shape[1])])
  x = layer_norm(x, e + 'LayerNorm')
  heads = config['num_attention_heads']
  split = lambda t: t.reshape(t.shape[0], t.shape[1], heads, -1).transpose(0, 2, 1, 3)
  for i in range(config['num_hidden_layers']):
    p = f'bert/encoder/layer_{i}/'
    q, k, v = (split(dense(x, f'{p}attention/self/{n}')) for n in ('query', 'key', 'value'))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = (probs @ v).transpose(0, 2, 1, 3).reshape(x.shape)
    x = layer_norm(x + dense(context, f'{p}attention/output/dense'),
                   f'{p}attention/output/LayerNorm')
    hidden = gelu(dense(x, f'{p}intermediate/dense'))
    x = layer_norm(x + dense(hidden, f'{p}output/dense'), f'{p}output/LayerNorm')
  t = layer_norm(gelu(dense(x, 'cls/predictions/transform/dense')),
                 'cls/predictions/transform/LayerNorm')
  mlm = t @ w['bert/embeddings/word_embeddings'].T + w['cls/predictions/output_bias']
  pooled = np.tanh(dense(x[:, 0], 'bert/pooler/dense'))
  nsp = pooled @ w['cls/seq_relationship/output_weights'].T + w['cls/seq_relationship/output_bias']
  return mlm, nsp


@pytest.mark.slow
def test_transformers_loads_every_weight_and_computes_the_original_model(checkpoints):
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  prefix, tf_vars = checkpoints['bert']
  state, config = tf_checkpoint.load_tf_bert(prefix)
  model = transformers.BertForPreTraining(transformers.BertConfig(**config)).eval()
  result = model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()},
                                 strict=False)
  assert not result.unexpected_keys
  # Only what HF ties to other weights (the MLM decoder) or computes (position_ids) is left.
  assert set(result.missing_keys) <= {'cls.predictions.decoder.weight',
                                      'cls.predictions.decoder.bias',
                                      'bert.embeddings.position_ids'}, result.missing_keys
  assert set(state) | set(result.missing_keys) >= set(model.state_dict())
  for name, value in state.items():
    np.testing.assert_array_equal(model.state_dict()[name].numpy(), value, err_msg=name)
  np.testing.assert_array_equal(model.cls.predictions.decoder.weight.detach().numpy(),
                                tf_vars['bert/embeddings/word_embeddings'])

  rng = np.random.default_rng(2)
  ids = rng.integers(0, TINY['vocab_size'], (2, 7))
  types = rng.integers(0, 2, (2, 7))
  with torch.no_grad():
    out = model(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(types))
  weights = {n: v.astype(np.float64) for n, v in tf_vars.items()}
  mlm, nsp = original_bert_forward(weights, TINY, ids, types)
  np.testing.assert_allclose(out.prediction_logits.numpy(), mlm, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(out.seq_relationship_logits.numpy(), nsp, rtol=1e-4, atol=1e-4)


def test_bert_jax_imports_the_tf_checkpoint_and_computes_the_original_model(checkpoints):
  from bert_jax.tools import convert  # pylint: disable=g-import-not-at-top
  from bert_jax.train import step as steps  # pylint: disable=g-import-not-at-top
  from configs import base  # pylint: disable=g-import-not-at-top
  prefix, tf_vars = checkpoints['bert']
  state, hf_config = tf_checkpoint.load_tf_bert(prefix)
  config = base.get_config()
  config.model.update(convert.hf_config_to_model_overrides(hf_config))
  config.model.update(hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
  params, report = convert.import_hf(state, config, hf_config=hf_config)
  assert not report.missing_heads
  rng = np.random.default_rng(2)
  ids = rng.integers(0, TINY['vocab_size'], (2, 7))
  types = rng.integers(0, 2, (2, 7))
  positions = np.tile(np.arange(7), (2, 1))
  out = steps.build_model(config).apply({'params': params}, {
      'input_ids': ids, 'segment_ids': types, 'input_mask': np.ones_like(ids),
      'masked_lm_positions': positions})
  weights = {n: v.astype(np.float64) for n, v in tf_vars.items()}
  mlm, nsp = original_bert_forward(weights, TINY, ids, types)
  np.testing.assert_allclose(out['mlm_logits'], mlm, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(out['nsp_logits'], nsp, rtol=1e-4, atol=1e-4)
