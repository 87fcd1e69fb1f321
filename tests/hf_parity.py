"""The Hugging Face parity harness every family's tests share: random odd-sized transformers
models, the batch both sides read, their MLM logits and ours, a directory's import, and the
counts of parameters held against transformers'.

tests/conformance/ runs it over every registered family with transformers' default settings of
the family's class; a family's own test file runs it over the variants only that family has.
"""

import jax
import numpy as np

from bert_jax import config_lib
from bert_jax import models
from bert_jax.interop import hf
from bert_jax.interop import param_tree
from bert_jax.models import hf_layout
from bert_jax.train import step as steps
from configs import base
from conftest import require

# Odd sizes, none a multiple of another, so that a transposed or mis-split axis cannot line up:
# 3 heads of 14 (even, for rotary positions), a feed-forward of 50, a vocab of 97.
ODD_SIZES = dict(num_layers=3, hidden_size=42, num_heads=3, intermediate_size=50, vocab_size=97,
                 max_position_embeddings=64)
IMPORT_TOLERANCE, EXPORT_TOLERANCE = 1e-4, 1e-5
# 3 rows of 13 tokens, two of them padded; 4 predicted positions a row.
ROWS, LENGTH = 3, 13
POSITIONS = np.array([[1, 4, 7, 12], [0, 2, 3, 8], [1, 2, 3, 4]], np.int32)


torch = require('torch')
transformers = require('transformers')


def randomise(model, scale=0.05):
  """Every parameter random, norms' scales about one (zero biases and unit norms, as
  transformers initialises them, would hide a swapped leaf)."""
  torch.manual_seed(0)
  with torch.no_grad():
    for name, param in model.named_parameters():
      norm = 'norm.weight' in name.lower()
      param.copy_(torch.randn_like(param) * scale + (1.0 if norm else 0.0))
  return model.eval()


def hf_class(hf_config: dict):
  """The transformers class a config.json's `architectures` names."""
  return getattr(transformers, hf_config['architectures'][0])


def hf_config_object(hf_config: dict):
  """config.json's fields as the transformers config of its model_type."""
  fields = {k: v for k, v in hf_config.items() if k not in ('architectures', 'model_type')}
  return transformers.AutoConfig.for_model(hf_config['model_type'], **fields)


def our_config(hf_config: dict, objectives='mlm', scan_layers=True, name=None, **model):
  """configs/base.py shaped and switched as config.json `hf_config`; `name` for a family that
  shares another's layout (a test's)."""
  config = base.get_config()
  config.model.update(hf.hf_config_to_model_overrides(hf_config))
  config.model.update(scan_layers=scan_layers, **({'name': name} if name else {}), **model)
  config.objectives = objectives
  config.data.corpus = 'builtin'
  return rows_within_positions(config)


def rows_within_positions(config):
  """`config` with its rows within the position table (RoBERTa's starts at row 2), and still
  longer than the test batch."""
  offset = models.get(config.model.name).position_offset
  config.data.max_seq_length = min(config.data.max_seq_length,
                                   config.model.max_position_embeddings - offset)
  return config


def has_layout(name: str) -> bool:
  """Whether family `name` has a Hugging Face layout."""
  return any(layout.family == name for layout in hf_layout.layouts())


def family_config(name: str, scan_layers=True):
  """The family at odd sizes, MLM only: switched as transformers' default of its class where it
  has one, else as configs/base.py."""
  if has_layout(name):
    config = our_config(family_hf_config(name), name=name, scan_layers=scan_layers)
  else:
    config = base.get_config('corpus=builtin')
    config.model.update(name=name, scan_layers=scan_layers, **ODD_SIZES)
    config.objectives = 'mlm'
    rows_within_positions(config)
  config_lib.validate(config)
  return config


def family_hf_config(name: str) -> dict:
  """config.json of family `name`'s masked-LM class at ODD_SIZES, every other setting
  transformers' default for its model_type."""
  layout = hf_layout.for_family(name)
  default = transformers.AutoConfig.for_model(layout.model_type).to_dict()
  config = our_config(default, name=name, **ODD_SIZES)
  return layout.to_hf_config(config)


def random_model(hf_config: dict, directory: str | None = None, scale=0.05, cls=None):
  """A random transformers model of `hf_config` (its `architectures` class, or `cls`) in eval
  mode, saved to `directory` when one is given."""
  model = randomise((cls or hf_class(hf_config))(hf_config_object(hf_config)), scale)
  if directory:
    model.save_pretrained(directory)
  return model


def batch(hf_config: dict, seed=0) -> dict:
  """Ids (never the pad id, which is every padded token's), segments where the model has two or
  more, the mask and the predicted positions, as our batch keys."""
  pad = hf_config.get('pad_token_id') or 0
  rng = np.random.default_rng(seed)
  mask = np.ones((ROWS, LENGTH), np.int32)
  mask[1, 9:] = mask[2, 5:] = 0
  ids = rng.integers(max(pad, 3) + 1, hf_config['vocab_size'], (ROWS, LENGTH)).astype(np.int32)
  ids[mask == 0] = pad
  segments = np.zeros_like(ids)
  if hf_config.get('type_vocab_size', 0) >= 2:
    segments = (np.arange(LENGTH) >= rng.integers(3, 10, (ROWS, 1))).astype(np.int32) * mask
  return {'input_ids': ids, 'segment_ids': segments, 'input_mask': mask,
          'masked_lm_positions': POSITIONS}


def run_hf(model, inputs: dict) -> np.ndarray:
  """A transformers model's MLM logits at the predicted positions."""
  out = hf_outputs(model, as_tuple(inputs))
  logits = out.prediction_logits if hasattr(out, 'prediction_logits') else out.logits
  return np.take_along_axis(logits.numpy(), inputs['masked_lm_positions'][..., None], axis=1)


def run_ours(params, config, inputs: dict) -> np.ndarray:
  """Our model's MLM logits at the predicted positions."""
  return np.asarray(steps.build_model(config).apply({'params': params}, inputs)['mlm_logits'])


def imported(directory: str, config):
  """(params, report) of import_hf of a saved directory, what it lacks (a pooler the head class
  has not) from a fresh init."""
  state_dict, hf_config = hf.load_hf_state_dict(directory)
  params, report = hf.import_hf(state_dict, config, hf_config=hf_config)
  return hf.merge_missing(params, hf.init_params(config, seed=1), config), report


def max_diff(a, b) -> float:
  return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def random_params(config, seed=3, scale=0.05):
  """Our fresh parameters, each moved by noise (a fresh init's zero biases and unit scales would
  hide a swapped leaf)."""
  params = hf.init_params(config, seed=seed)
  leaves, tree = jax.tree.flatten(params)
  rng = np.random.default_rng(seed)
  return jax.tree.unflatten(tree, [
      np.asarray(x) + rng.normal(size=np.shape(x)).astype(np.asarray(x).dtype) * scale
      for x in leaves])


def count(shapes) -> int:
  return sum(int(np.prod(s)) for s in shapes)


def exported_count(config) -> int:
  """Parameters of our model that its HF class holds: all, less a pooler the class has not."""
  layout = hf_layout.for_config(config)
  keep_pooler = layout.exports_pooler(config)
  return count(s for k, s in hf.leaf_shapes(config).items()
               if keep_pooler or not k.startswith('bert/pooler/'))


def assert_imports(model, directory: str, config, inputs: dict | None = None):
  """Imports `directory` (transformers' `model`, saved) into `config`: the MLM logits are
  transformers' within IMPORT_TOLERANCE. Returns (params, report)."""
  params, report = imported(directory, config)
  inputs = inputs or batch(model.config.to_dict())
  difference = max_diff(run_ours(params, config, inputs), run_hf(model, inputs))
  print(f'{config.model.name} import from {report.layout}: MLM logits max |ours - '
        f'transformers| {difference:.2e}')
  assert difference < IMPORT_TOLERANCE, difference
  return params, report


def assert_exports(params, config, directory, inputs: dict | None = None):
  """Exports `params` to `directory`: transformers' AutoModelForMaskedLM loads the class
  config.json names with no key missing, unexpected or misshapen and computes our MLM logits
  within EXPORT_TOLERANCE; imported and exported again, the checkpoint is the same to the bit.
  Returns the loaded model."""
  directory = str(directory)
  hf.export_hf(params, config, directory)
  loaded, info = transformers.AutoModelForMaskedLM.from_pretrained(directory,
                                                                   output_loading_info=True)
  assert not any(info[k] for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys')), info
  hf_config = hf.model_to_hf_config(config)
  assert type(loaded).__name__ == hf_config['architectures'][0]
  inputs = inputs or batch(hf_config)
  difference = max_diff(run_hf(loaded.eval(), inputs), run_ours(params, config, inputs))
  print(f'{config.model.name} export to {type(loaded).__name__}: MLM logits max diff '
        f'{difference:.2e}')
  assert difference < EXPORT_TOLERANCE, difference
  again, _ = imported(directory, config)
  hf.export_hf(again, config, directory + '_again')
  first, _ = hf.load_hf_state_dict(directory)
  second, _ = hf.load_hf_state_dict(directory + '_again')
  assert first.keys() == second.keys()
  for key, value in first.items():
    np.testing.assert_array_equal(second[key], value, err_msg=key)
  return loaded


def assert_scanned_equals_unrolled(params, unrolled, scanned, inputs: dict) -> dict:
  """`params` of the unrolled config, stacked for the scanned one: MLM logits and every
  parameter's gradient (dropout off) equal. Returns the scanned gradients, flattened."""
  stacked = param_tree.unflatten(param_tree.stack_layers(param_tree.flatten(params),
                                                         unrolled.model.num_layers))

  def loss(p, config):
    return steps.build_model(config).apply({'params': p}, inputs)['mlm_logits'].sum()

  assert max_diff(run_ours(stacked, scanned, inputs), run_ours(params, unrolled, inputs)) < 1e-5
  grads = param_tree.flatten(jax.grad(loss)(params, unrolled))
  grads_scanned = param_tree.flatten(jax.grad(loss)(stacked, scanned))
  unstacked = param_tree.unstack_layers(grads_scanned)
  assert set(unstacked) == set(grads)
  for key, grad in grads.items():
    np.testing.assert_allclose(unstacked[key], grad, rtol=1e-4, atol=1e-5, err_msg=key)
  return grads_scanned


def as_tuple(inputs: dict) -> tuple:
  """(ids, segments, mask, positions) of a batch: the form the per-family harnesses take."""
  return tuple(inputs[k] for k in ('input_ids', 'segment_ids', 'input_mask',
                                   'masked_lm_positions'))


def hf_outputs(model, inputs: tuple):
  """transformers' output of `model` on (ids, segments, mask, ...), every layer's states in it;
  the segments only where one is not 0 (classes without a segment table take none)."""
  ids, segments, mask = inputs[:3]
  as_long = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
  extra = {'token_type_ids': as_long(segments)} if np.any(segments) else {}
  with torch.no_grad():
    return model(input_ids=as_long(ids), attention_mask=as_long(mask), output_hidden_states=True,
                 **extra)


def our_outputs(params, config, inputs: tuple) -> tuple[dict, np.ndarray]:
  """(our pretraining model's outputs, its encoder's sequence output) on (ids, segments, mask,
  positions), jitted."""
  model = steps.build_model(config)
  family = models.get(config.model.name)
  encoder = family.encoder(model.config)

  def forward(p, ids, segments, mask, positions):
    out = model.apply({'params': p}, {'input_ids': ids, 'segment_ids': segments,
                                      'input_mask': mask, 'masked_lm_positions': positions})
    return out, encoder.apply({'params': p[family.scope]}, ids, segments, mask)[0]
  out, sequence = jax.jit(forward)(params, *inputs)
  return jax.tree.map(np.asarray, out), np.asarray(sequence)


def saved_models(tmp_path_factory, hf_configs: dict, cls, scale=0.05) -> dict:
  """name -> (a random `cls` model of each transformers config, the directory it is saved in)."""
  out = {}
  for name, hf_config in hf_configs.items():
    directory = str(tmp_path_factory.mktemp(name))
    out[name] = random_model(hf_config.to_dict(), directory, scale, cls), directory
  return out


def features(split) -> tuple:
  """(ids, segments, mask) of a fine-tuning split's features, for hf_outputs."""
  return tuple(split.features[k] for k in ('input_ids', 'segment_ids', 'input_mask'))


def hf_pretraining_outputs(model, inputs: tuple) -> tuple:
  """(MLM logits at the positions, the sentence head's logits (NSP's, SOP's) or None, the last
  hidden states) of a transformers model on (ids, segments, mask, positions)."""
  out = hf_outputs(model, inputs)
  logits = out.prediction_logits if hasattr(out, 'prediction_logits') else out.logits
  mlm = np.take_along_axis(logits.numpy(), inputs[3][..., None], axis=1)
  sentence = next((getattr(out, k).numpy() for k in ('seq_relationship_logits', 'sop_logits')
                   if getattr(out, k, None) is not None), None)
  return mlm, sentence, out.hidden_states[-1].numpy()


def our_pretraining_outputs(params, config, inputs: tuple) -> tuple:
  """hf_pretraining_outputs' three of our model: MLM logits, NSP's or SOP's or None, the
  sequence output."""
  out, sequence = our_outputs(params, config, inputs)
  sentence = next((out[k] for k in ('nsp_logits', 'sop_logits') if k in out), None)
  return out['mlm_logits'], sentence, sequence
