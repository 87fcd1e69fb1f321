"""A SpanBERT workdir ('mlm,sbo') exports as BERT's BertForMaskedLM, the span boundary head left
out and said so, and fine-tunes as a BERT workdir does."""

import logging

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import torch
import transformers

from bert_jax.tools import convert
from bert_jax.train import pretrain
from bert_jax.train import step as steps
from conftest import micro_config

pytestmark = pytest.mark.slow  # A tiny pretraining run first: about 40 s on 2 CPU cores.


@pytest.fixture(scope='module', name='spanbert_workdir')
def fixture_spanbert_workdir(tmp_path_factory):
  """(a 2-step 'mlm,sbo' pretraining workdir, its config)."""
  tmp_path = tmp_path_factory.mktemp('spanbert')
  config = micro_config(tmp_path, objectives='mlm,sbo', **{
      'masking.spans': 'geometric', 'masking.whole_word': True, 'train.num_steps': 2,
      'train.warmup_steps': 1, 'train.log_every': 1, 'train.eval_every': 2,
      'train.checkpoint_every': 2})
  workdir = tmp_path / 'run'
  pretrain.train_and_evaluate(config, str(workdir))
  return workdir, config


def test_export_is_bert_for_masked_lm_without_the_span_boundary_head(spanbert_workdir, tmp_path,
                                                                     caplog):
  workdir, config = spanbert_workdir
  out = tmp_path / 'hf'
  with caplog.at_level(logging.WARNING):
    assert convert.export_workdir(str(workdir), str(out)) == 2
  assert any('span_boundary' in r.getMessage() and 'not exported' in r.getMessage()
             for r in caplog.records)
  loaded, info = transformers.AutoModelForMaskedLM.from_pretrained(str(out),
                                                                   output_loading_info=True)
  assert type(loaded).__name__ == 'BertForMaskedLM' and not info['missing_keys']
  # The export's MLM logits are the trained model's.
  params = ocp.StandardCheckpointer().restore(str(workdir / 'checkpoints' / '2' / 'state'))
  rng = np.random.default_rng(0)
  ids = rng.integers(5, config.model.vocab_size, (2, 9)).astype(np.int32)
  positions = np.array([[1, 2, 3], [4, 6, 7]], np.int32)
  batch = {'input_ids': ids, 'segment_ids': np.zeros_like(ids), 'input_mask': np.ones_like(ids),
           'masked_lm_positions': positions, 'masked_lm_ids': np.zeros_like(positions),
           'masked_lm_weights': np.ones(positions.shape, np.float32),
           'span_left_positions': positions - 1, 'span_right_positions': positions + 1,
           'span_offsets': np.zeros_like(positions)}
  ours = steps.build_model(config).apply({'params': jax.tree.map(np.asarray, params['params'])},
                                         batch)['mlm_logits']
  with torch.no_grad():
    theirs = loaded.eval()(input_ids=torch.tensor(ids, dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(np.take_along_axis(theirs, positions[..., None], axis=1), ours,
                             atol=1e-4)


def test_fine_tuning_starts_from_a_spanbert_workdir(spanbert_workdir, tmp_path):
  from test_family_finetune import run_sst2  # pylint: disable=g-import-not-at-top
  workdir, _ = spanbert_workdir
  results, saved = run_sst2(tmp_path, str(workdir))
  assert saved['model']['name'] == 'bert' and saved['data']['vocab_file'] == str(
      workdir / 'vocab.txt')
  assert np.isfinite(results['median']['dev']['accuracy'])
