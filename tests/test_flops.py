"""model_flops_per_sequence for ALBERT, derived by hand from the shapes of its matmuls."""

import pytest

from bert_jax.train import metrics
from configs import albert

# Odd sizes, so that no two terms can stand in for each other.
L, H, E, F, V, S, P = 3, 48, 24, 80, 97, 13, 4


def mm(m, n, k):
  """FLOPs of an [m, k] x [k, n] matmul."""
  return 2 * m * n * k


def albert_config(objectives_):
  config = albert.get_config('size=base')
  config.model.update(num_layers=L, hidden_size=H, num_heads=3, intermediate_size=F,
                      embedding_size=E, vocab_size=V, causal=objectives_ == 'clm')
  config.data.update(max_seq_length=S, max_predictions_per_seq=P)
  config.objectives = objectives_
  return config


def encoder_forward():
  """One sequence through ALBERT's encoder: the E -> H projection of every token, the shared
  layer applied L times (Q, K, V and output projections, scores and context over all S x S
  pairs, the feed-forward in and out), the pooler on [CLS]."""
  projection = mm(S, H, E)
  layer = (4 * mm(S, H, H)  # Q, K, V, attention output.
           + mm(S, S, H) + mm(S, H, S)  # Q K^T over the heads, probabilities x V.
           + mm(S, F, H) + mm(S, H, F))  # Feed-forward in and out.
  pooler = mm(1, H, H)
  return projection + L * layer + pooler


def head_forward(positions):
  """MLM's head at `positions` rows: transform H -> E, logits against the E x V embeddings."""
  return mm(positions, E, H) + mm(positions, V, E)


@pytest.mark.parametrize('objectives_,predicted', [('mlm', P), ('mlm,sop', P), ('clm', S)])
def test_albert_flops_are_its_matmuls_times_three(objectives_, predicted):
  """Forward + backward = 3 x forward; SOP's two logits a pair are not counted (as NSP's)."""
  expected = 3 * (encoder_forward() + head_forward(predicted))
  assert metrics.model_flops_per_sequence(albert_config(objectives_)) == expected


def test_albert_flops_fall_with_the_embedding_width():
  """The factorised embedding is what the count sees: a narrower E costs fewer FLOPs in the
  projection and the head, the same in the layers."""
  wide, narrow = albert_config('mlm,sop'), albert_config('mlm,sop')
  narrow.model.embedding_size = E // 2
  difference = (metrics.model_flops_per_sequence(wide)
                - metrics.model_flops_per_sequence(narrow))
  assert difference == 3 * (mm(S, H, E - E // 2) + mm(P, E - E // 2, H) + mm(P, V, E - E // 2))
