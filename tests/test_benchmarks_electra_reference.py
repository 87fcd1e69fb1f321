"""benchmarks/electra_reference.py: HF's ELECTRA shares and ties the embeddings as the reference
does, trains on the run's own batches, and scores the discriminator with the exact pairwise AUC."""

import json

import numpy as np
import pytest

from conftest import micro_config
from benchmarks import electra_reference

RTD = {'model.name': 'electra', 'model.embedding_size': 16, 'model.generator_fraction': 0.5,
       'masking.mask_token_fraction': 0.85, 'masking.random_token_fraction': 0.0,
       'masking.keep_fraction': 0.15, 'train.num_steps': 4}


def test_exact_auc_is_the_pairwise_share_with_ties_half():
  rng = np.random.default_rng(0)
  scores = np.round(rng.normal(size=300), 1)  # Rounded: ties across and within the classes.
  labels = (rng.random(300) < 0.2 + 0.3 * (scores > 0)).astype(np.float32)
  pairs = scores[labels > 0][:, None] - scores[labels == 0][None, :]
  expected = ((pairs > 0).sum() + 0.5 * (pairs == 0).sum()) / pairs.size
  assert electra_reference.exact_auc(scores, labels) == pytest.approx(expected, rel=1e-12)
  assert electra_reference.exact_auc(scores, np.zeros(300)) is None


def test_generator_shares_the_discriminators_embeddings_and_ties_its_output():
  model = micro_config(None, objectives='rtd', **RTD).model
  disc, gen = electra_reference.reference_models(model, 'cpu')
  words = disc.electra.embeddings.word_embeddings.weight
  assert gen.electra.embeddings is disc.electra.embeddings  # Tables and LayerNorm.
  assert gen.generator_lm_head.weight is words
  assert gen.config.hidden_size == model.hidden_size // 2
  assert words.shape == (model.vocab_size, 16)


def test_reference_trains_on_the_runs_batches_and_logs_each_interval(tmp_path):
  config = micro_config(tmp_path, objectives='rtd', **RTD)
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / 'config.json').write_text(json.dumps(config.to_dict()))
  out = tmp_path / 'reference.jsonl'
  records = electra_reference.train(config, str(workdir), 4, 2, 'cpu', str(out))
  assert [r['step'] for r in records] == [2, 4]
  assert [json.loads(line) for line in out.read_text().splitlines()] == records
  first = records[0]
  # Untrained: the generator near uniform over the vocab, the discriminator near chance.
  assert first['gen_loss'] == pytest.approx(np.log(config.model.vocab_size), rel=0.05)
  assert 0.3 < first['disc_auc'] < 0.7
  # The masked share (15%) less the samples that hit the original token.
  assert 0.05 < first['replaced_fraction'] <= 0.16


def test_a_run_of_another_objective_is_refused_naming_it(tmp_path):
  config = micro_config(tmp_path)
  with pytest.raises(ValueError, match="objectives='mlm,nsp'"):
    electra_reference.train(config, str(tmp_path), 2, 1, 'cpu')
