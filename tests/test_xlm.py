"""XLM and XLM-R ('xlm'): transformers' XLMRobertaForMaskedLM in and out, rows with their own
position ids, and language embeddings."""

import json

import jax
import numpy as np
import pytest

from bert_jax import models
from bert_jax.interop import hf
from bert_jax.interop import hf_families
from bert_jax.interop import init_from
from bert_jax.interop import param_tree
from bert_jax.train import step as steps
from configs import base
# The HF directory import and the difference every interop test takes.
from test_distilbert import imported, max_diff  # pylint: disable=g-bad-import-order

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

PAD = 1  # XLM-R's <pad>: fairseq's padding_idx.
# Odd sizes (none of the other families' tests' shapes), so a transposed or mis-split axis
# cannot line up.
HF_SIZES = dict(num_hidden_layers=3, hidden_size=36, num_attention_heads=3, intermediate_size=68,
                vocab_size=89, max_position_embeddings=19, type_vocab_size=1,
                layer_norm_eps=1e-5, pad_token_id=PAD)
IMPORT_TOLERANCE, EXPORT_TOLERANCE = 1e-4, 1e-5
LENGTH = 15  # Tokens a row.

# Interop.

@pytest.fixture(scope='module', name='hf_model')
def fixture_hf_model(tmp_path_factory):
  """(a random XLMRobertaForMaskedLM in eval mode, the dir it was saved to)."""
  model = transformers.XLMRobertaForMaskedLM(transformers.XLMRobertaConfig(**HF_SIZES))
  torch.manual_seed(0)
  with torch.no_grad():  # Every parameter random: unit LayerNorms would hide a swapped leaf.
    for name, param in model.named_parameters():
      norm = 'LayerNorm.weight' in name or 'layer_norm.weight' in name
      param.copy_(torch.randn_like(param) * 0.05 + (1.0 if norm else 0.0))
  directory = str(tmp_path_factory.mktemp('xlmr'))
  model.save_pretrained(directory)
  return model.eval(), directory


def our_config(scan_layers=True, **model):
  config = base.get_config()
  config.model.update(hf.hf_config_to_model_overrides(
      transformers.XLMRobertaConfig(**HF_SIZES).to_dict()), scan_layers=scan_layers, **model)
  config.objectives = 'mlm'
  return config


def inputs(reset_at=None):
  """3 x LENGTH ids with <pad> tails in two rows, 4 prediction positions a row; with reset_at
  the position ids of translation rows, restarting at that token."""
  rng = np.random.default_rng(0)
  mask = np.ones((3, LENGTH), np.int32)
  mask[1, 11:] = mask[2, 6:] = 0
  ids = np.where(mask > 0, rng.integers(PAD + 2, HF_SIZES['vocab_size'], mask.shape), PAD)
  batch = {'input_ids': ids.astype(np.int32), 'input_mask': mask,
           'segment_ids': np.zeros_like(mask),
           'masked_lm_positions': np.array([[1, 4, 7, 14], [0, 2, 3, 10], [1, 2, 3, 5]],
                                           np.int32)}
  if reset_at is not None:
    positions = np.arange(LENGTH) - np.where(np.arange(LENGTH) >= reset_at, reset_at, 0)
    batch['position_ids'] = (np.broadcast_to(positions, mask.shape) * mask).astype(np.int32)
    batch['language_ids'] = ((np.arange(LENGTH) >= reset_at) * mask).astype(np.int32)
  return batch


def run_ours(params, config, batch):
  """(MLM logits at the batch's positions, the encoder's last layer's states)."""
  model = steps.build_model(config)
  encoder = models.get('xlm').encoder(model.config)

  def forward(p, batch):
    hidden = encoder.apply({'params': p['bert']}, batch['input_ids'], batch['segment_ids'],
                           batch['input_mask'], True, batch.get('position_ids'),
                           language_ids=batch.get('language_ids'))[0]
    return model.apply({'params': p}, batch)['mlm_logits'], hidden
  return tuple(np.asarray(x) for x in jax.jit(forward)(params, batch))


def run_hf(model, batch):
  """(MLM logits at the positions, last hidden states) of transformers' model; position ids as
  ours give them (fairseq's: + 2, padding row 1) when the batch has its own."""
  mask = batch['input_mask']
  kwargs = {}
  if 'position_ids' in batch:
    kwargs['position_ids'] = torch.tensor(np.where(mask > 0, batch['position_ids'] + 2, PAD),
                                          dtype=torch.long)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(batch['input_ids'], dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long), output_hidden_states=True,
                **kwargs)
  logits = np.take_along_axis(out.logits.numpy(), batch['masked_lm_positions'][..., None], 1)
  return logits, out.hidden_states[-1].numpy()


def differences(ours, theirs) -> dict:
  return {name: max_diff(a, b) for name, a, b in zip(('mlm', 'hidden'), ours, theirs)}


@pytest.mark.parametrize('scan_layers', [True, pytest.param(False, marks=pytest.mark.slow)])
def test_xlm_roberta_checkpoint_imports_and_matches_transformers(hf_model, scan_layers):
  config = our_config(scan_layers)
  assert (config.model.name, config.model.num_languages) == ('xlm', 0)
  params, report = imported(hf_model[1], config)
  assert report.layout == 'XLMRobertaForMaskedLM' and report.missing_heads == ['bert/pooler']
  params = hf.merge_missing(params, hf.init_params(config, seed=1), config)
  diffs = differences(run_ours(params, config, inputs()), run_hf(hf_model[0], inputs()))
  print(f'XLMRobertaForMaskedLM import (scan_layers={scan_layers}), max |ours - transformers|: '
        + ', '.join(f'{k} {v:.2e}' for k, v in diffs.items()))
  assert max(diffs.values()) < IMPORT_TOLERANCE, diffs


def test_translation_rows_read_their_position_ids_as_transformers_does(hf_model):
  """Positions restarting at token 7 (a TLM row) give transformers' outputs at the same
  positions; without them (fairseq's numbering from the mask) the outputs differ."""
  config = our_config()
  params, _ = imported(hf_model[1], config)
  params = hf.merge_missing(params, hf.init_params(config, seed=1), config)
  batch = inputs(reset_at=7)
  diffs = differences(run_ours(params, config, batch), run_hf(hf_model[0], batch))
  print('XLMRobertaForMaskedLM, rows with positions reset at 7, max |ours - transformers|: '
        + ', '.join(f'{k} {v:.2e}' for k, v in diffs.items()))
  assert max(diffs.values()) < IMPORT_TOLERANCE, diffs
  counted = {k: v for k, v in batch.items() if k != 'position_ids'}
  assert max_diff(run_ours(params, config, counted)[1], run_hf(hf_model[0], batch)[1]) > 1e-2


def test_init_from_adopts_xlm_r_s_family_and_shape(hf_model, tmp_path):
  config = base.get_config()  # A BERT config: the checkpoint's family wins.
  config.init_from = f'hf:{hf_model[1]}'
  config.data.vocab_file = str(tmp_path / 'spiece.model')
  init_from.adopt_source(config)
  m = config.model
  assert (m.name, m.num_languages, m.num_layers, m.hidden_size, m.vocab_size, m.type_vocab_size,
          m.max_position_embeddings, m.layer_norm_eps) == ('xlm', 0, 3, 36, 89, 1, 19, 1e-5)
  assert init_from.source_tokenizer(config.init_from)[0] == 'sentencepiece'


def test_export_loads_in_transformers_as_xlm_roberta_and_round_trips(tmp_path):
  config = our_config()
  params = hf.init_params(config, seed=3)
  hf.export_hf(params, config, str(tmp_path))
  written = json.loads((tmp_path / 'config.json').read_text())
  assert (written['model_type'], written['architectures']) == (
      'xlm-roberta', ['XLMRobertaForMaskedLM'])
  loaded, info = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path),
                                                                   output_loading_info=True)
  assert type(loaded).__name__ == 'XLMRobertaForMaskedLM'
  assert not any(info[k] for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys'))
  for batch in (inputs(), inputs(reset_at=7)):
    diffs = differences(run_ours(params, config, batch), run_hf(loaded.eval(), batch))
    print('XLMRobertaForMaskedLM export -> transformers, max |ours - transformers|: '
          + ', '.join(f'{k} {v:.2e}' for k, v in diffs.items()))
    assert max(diffs.values()) < EXPORT_TOLERANCE, diffs
  again, _ = imported(str(tmp_path), config)
  flat, flat_again = param_tree.flatten(params), param_tree.flatten(again)
  assert set(flat_again) == {k for k in flat if '/pooler/' not in k}
  assert all(np.array_equal(flat[k], flat_again[k]) for k in flat_again)


def test_language_embeddings_add_each_token_s_language_row():
  """With every language row zero the model is XLM-R's; a row moves only its language's
  tokens' embeddings."""
  config = our_config(num_languages=2)
  with_table = hf.init_params(config, seed=3)
  table = with_table['bert']['embeddings'].pop('language_embeddings')
  assert table.shape == (2, HF_SIZES['hidden_size'])
  without = our_config()
  batch = inputs(reset_at=7)
  reference = run_ours(with_table, without, batch)
  zero = jax.tree.map(np.copy, with_table)
  zero['bert']['embeddings']['language_embeddings'] = np.zeros_like(table)
  np.testing.assert_array_equal(run_ours(zero, config, batch)[1], reference[1])
  zero['bert']['embeddings']['language_embeddings'][1] = table[1]
  moved = np.abs(run_ours(zero, config, batch)[1] - reference[1]).max(-1) > 1e-3  # [3, LENGTH]
  encoder = models.get('xlm').encoder(models.get('xlm').config_from(config))
  embedded = encoder.apply({'params': zero['bert']}, batch['input_ids'], batch['segment_ids'],
                           True, batch['position_ids'], batch['input_mask'],
                           batch['language_ids'], method=lambda m, *a: m.embeddings(*a))
  plain = encoder.apply({'params': zero['bert']}, batch['input_ids'], batch['segment_ids'], True,
                        batch['position_ids'], batch['input_mask'],
                        method=lambda m, *a: m.embeddings(*a))
  changed = np.abs(np.asarray(embedded) - np.asarray(plain)).max(-1) > 0
  np.testing.assert_array_equal(changed, batch['language_ids'] == 1)
  assert moved.any()


def test_export_refuses_language_embeddings(tmp_path):
  config = our_config(num_languages=2)
  with pytest.raises(hf_families.UnsupportedConfigError, match='num_languages=2.*no language'):
    hf.export_hf(hf.init_params(config), config, str(tmp_path))


def test_import_into_a_model_with_language_embeddings_is_refused(hf_model):
  config = our_config(num_languages=2)
  with pytest.raises(hf.CheckpointMismatchError, match='num_languages=0 but config.model.num_la'):
    imported(hf_model[1], config)
