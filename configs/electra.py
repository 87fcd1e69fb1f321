"""ELECTRA pretraining (Clark et al., 2020): replaced-token detection with a small generator.

Arguments (comma separated): `size=small|base|large|tiny` (default small), then configs/base.py's
(`configs/electra.py:size=base,steps=10000`). The paper fixes the warmup in steps (10,000 at
every size); `steps` without `warmup` keeps the warmup's share of the steps instead (1%: 30
steps at steps=3000, short enough that a small model's discriminator can die at its peak rate;
the run-health alarm `discriminator_at_prior` says so); `warmup=paper` keeps the 10,000 steps
and `warmup=N` sets it. The log's first lines say which warmup a run got.
The model is 'electra' (the discriminator: E-wide embeddings projected to H when E != H, BERT's
layers), the objective 'rtd' (the generator, 1/4 of H for small and large, 1/3 for base, with
its heads and feed-forward scaled alike, shares the embeddings; loss = its MLM loss + 50 x the
discriminator's). Shapes and recipe: the paper's Table 6 and google-research/electra's
configure_pretraining.py (Adam eps 1e-6, weight decay 0.01, 10k warmup, linear decay); the
masked positions hold [MASK] 85% of the time and the original token 15% (pretrain_helpers.mask),
no random tokens; predictions per row int((mask rate + 0.005) x seq), as the reference. The
vocab is BERT's uncased WordPiece.
"""

from configs import base
from configs import roberta

# (layers, hidden, heads, embedding width E, generator fraction of H, mask rate, seq, batch,
# learning rate, steps).
SIZES = {
    'small': (12, 256, 4, 128, 0.25, 0.15, 128, 128, 5e-4, 1_000_000),
    'base': (12, 768, 12, 768, 1 / 3, 0.15, 512, 256, 2e-4, 766_000),
    'large': (24, 1024, 16, 1024, 0.25, 0.25, 512, 2048, 2e-4, 400_000),
}


def get_config(arg=None):
  """ELECTRA-`size` (small by default); `arg` holds size= and configs/base.py's arguments."""
  size, arg = roberta.split_size(f'size=small,{arg or ""}', (*SIZES, 'tiny'))
  layers, hidden, heads, embed, fraction, rate, seq, batch, lr, steps = SIZES[
      'small' if size == 'tiny' else size]
  config = base.get_config()
  config.objectives = 'rtd'  # No NSP: single segments.
  config.model.update(
      name='electra', num_layers=layers, hidden_size=hidden, num_heads=heads,
      intermediate_size=4 * hidden, embedding_size=0 if embed == hidden else embed,
      generator_fraction=fraction, disc_weight=50.0)
  config.masking.update(rate=rate, mask_token_fraction=0.85, random_token_fraction=0.0,
                        keep_fraction=0.15)
  config.data.update(max_seq_length=seq,
                     max_predictions_per_seq=int((rate + 0.005) * seq))
  config.train.update(
      batch_size=batch, num_steps=steps, warmup_steps=10_000, learning_rate=lr,
      adam_eps=1e-6, weight_decay=0.01,
      # large's 2048 rows of 512 as 8 micro-batches of 256; scale it with the devices.
      grad_accum_steps=8 if size == 'large' else 1)
  if size == 'tiny':
    base.shrink_to_tiny(config)
  if arg:
    base.apply_pretraining_arguments(config, arg)
  return config
