"""param_tree: flat maps and the two encoder-layer layouts."""

import numpy as np

from bert_jax.interop import param_tree


def _unscanned(num_layers: int) -> dict:
  rng = np.random.default_rng(0)
  flat = {'bert/embeddings/word_embeddings/embedding': rng.normal(size=(7, 4))}
  for n in range(num_layers):
    flat[f'bert/encoder/layer_{n}/output/dense/kernel'] = rng.normal(size=(4, 4))
    flat[f'bert/encoder/layer_{n}/output/LayerNorm/scale'] = rng.normal(size=(4,))
  return flat


def test_stack_then_unstack_gives_back_every_leaf():
  flat = _unscanned(3)
  scanned = param_tree.stack_layers(flat, 3)
  assert scanned['bert/encoder/layer/output/dense/kernel'].shape == (3, 4, 4)
  np.testing.assert_array_equal(scanned['bert/encoder/layer/output/dense/kernel'][2],
                                flat['bert/encoder/layer_2/output/dense/kernel'])
  assert not any(param_tree.LAYER.match(k) for k in scanned)
  again = param_tree.unstack_layers(scanned)
  assert again.keys() == flat.keys()
  for key, value in flat.items():
    np.testing.assert_array_equal(again[key], value)


def test_flatten_and_unflatten_are_inverse():
  tree = {'bert': {'pooler': {'dense': {'kernel': np.ones((2, 2))}}}, 'nsp': {'bias': np.ones(2)}}
  flat = param_tree.flatten(tree)
  assert sorted(flat) == ['bert/pooler/dense/kernel', 'nsp/bias']
  assert param_tree.unflatten(flat).keys() == tree.keys()
