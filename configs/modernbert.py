"""ModernBERT pretraining (Warner et al., 2024): the modern encoder block on a masked LM, with
its release's recipe.

Arguments (comma separated): `size=base|large|tiny` (default base), then configs/base.py's
(`configs/modernbert.py:size=large,steps=10000`; `steps` without `warmup` keeps the warmup's
share, and the batch-size warmup's; `tokens=20B` does the same in tokens, `decay_tokens=2B` adds a
decay: docs/pretraining.md). The model is 'modernbert' (models/modernbert/): pre-norm
layers with LayerNorms without biases, no biases anywhere else, GeGLU feed-forward, rotary
positions, every third layer global and the others attending within 128 tokens; MLM only at a
30% masking rate; byte-level BPE rows of 1,024 tokens filled with whole sentences
(FULL-SENTENCES rows: no padding computed); dropout 0 as in the released checkpoints' configs.
Shapes are those of answerdotai/ModernBERT-base and -large.

The recipe is the release's 1,024-token pretraining (its yamls/modernbert/
modernbert-base-pretrain.yaml): StableAdamW at 8e-4 (large: 5e-4, the paper's), betas 0.9 /
0.98, eps 1e-6; warmup-stable-decay with a 3B-token warmup (large: 2B, the paper's) and no
decay (`t_decay: 0tok`: decays branch from its checkpoints, docs/pretraining.md); 1,719B tokens
in batches of 4,608 rows grown from 768 over the first 50B tokens (its 96 rows a GPU on 8
GPUs); rotary theta 10,000 in every layer (`rotary_emb_base`: the context extension raises the
global layers' to 160,000, the released checkpoints' value). Weight decay 1e-5 is decoupled
from the learning rate there (torch-optimi's `decouple_lr`: each step multiplies a weight by
1 - 1e-5 x lr_t / peak); optax's AdamW decay multiplies by 1 - lr_t x wd, so ours is 1e-5 /
peak (0.0125 for base). Ours, not the release's: large keeps base's batch and batch warmup, and
no dropout after the attention output (the release's yaml drops 10% there; transformers'
ModernBERT has no such dropout).
"""

from bert_jax.data import token_budget
from configs import base
from configs import roberta

# (layers, hidden, heads, feed-forward width, peak learning rate, warmup tokens).
SIZES = {'base': (22, 768, 12, 1152, 8e-4, 3_000_000_000),
         'large': (28, 1024, 16, 2624, 5e-4, 2_000_000_000)}
TOKENS = 1_719_000_000_000  # The release's max_duration.
BATCH_WARMUP = (768, 50_000_000_000)  # (first batch, tokens) of its batch-size warmup.
DECOUPLED_WEIGHT_DECAY = 1e-5  # The release's, not scaled by the learning rate.


def get_config(arg=None):
  """ModernBERT-`size` (base by default); `arg` holds size= and configs/base.py's arguments."""
  size, arg = roberta.split_size(arg, (*SIZES, 'tiny'))
  layers, hidden, heads, mlp, lr, warmup = SIZES['base' if size == 'tiny' else size]
  config = base.get_config()
  config.objectives = 'mlm'  # No NSP: full rows of sentences.
  config.model.update(
      name='modernbert', vocab_size=50368, num_layers=layers, hidden_size=hidden,
      num_heads=heads, intermediate_size=mlp, max_position_embeddings=8192,
      type_vocab_size=1, layer_norm_eps=1e-5, hidden_dropout_rate=0.0,
      attention_dropout_rate=0.0, norm='layer_norm', use_bias=False, feed_forward='geglu',
      positions='rotary', rope_theta=10_000.0, local_rope_theta=10_000.0, local_window=128,
      global_every=3,
      # The first layer and the local ones differ from the others: unrolled.
      scan_layers=False)
  config.masking.rate = 0.3
  config.masking.eval = 'reference'  # Held out at 15% (80/10/10), as the release evaluates.
  config.data.update(
      tokenizer='bpe', lowercase=False, tokenizer_vocab_size=50368, rows='full_sentences',
      max_seq_length=1024, max_predictions_per_seq=308)
  train = config.train
  train.update(
      optimizer='stableadamw', learning_rate=lr, adam_b2=0.98, adam_eps=1e-6,
      weight_decay=DECOUPLED_WEIGHT_DECAY / lr, schedule='wsd', decay_steps=0,
      batch_size=4608, batch_warmup_rows=BATCH_WARMUP[0], batch_warmup_tokens=BATCH_WARMUP[1],
      # 4608 rows of 1024 as 18 micro-batches of 256; scale it with the devices (a multiple of
      # 6 keeps the batch warmup's 768 rows whole micro-batches).
      grad_accum_steps=18)
  # The release states its schedule in tokens; in steps, the warmup's smaller batches counted.
  train.num_steps = token_budget.steps_for_tokens(config, TOKENS)
  train.warmup_steps = token_budget.step_reaching(config, warmup)
  if size == 'tiny':
    base.shrink_to_tiny(config)
  if arg:
    base.apply_pretraining_arguments(config, arg)
  return config
