"""BERT's block against the modern encoder's (ModernBERT) and DeBERTa's attention, and the modern
block with one switch turned back at a time.

Every arm is configs/small.py's shape (6 layers, 768 wide, 12 heads, seq 128, batch 256) trained
with MLM alone on single segments of the same documents, the same WordPiece vocab and masks,
for the same training FLOPs (`sweep.equal_flops`): the gated feed-forward is 2048 wide, so that
its three matrices cost what BERT's two of 3072 do. What each arm changes:

  bert          BERT's post-LN block (learned positions, biases, GELU feed-forward).
  modern        models/modernbert/: pre-LN without biases, GeGLU, rotary positions (theta
                160,000 global, 10,000 local), every third layer global and the others within
                a 128-token window (64 each side).
  modern_r30    the same at ModernBERT's 30% masking rate: its recipe's block and masking.
  -rotary       the modern block with learned absolute positions.
  -geglu        the modern block with BERT's GELU feed-forward (3072 wide).
  -local        the modern block with every layer global.
  deberta       BERT's layers with DeBERTa-v3's disentangled attention (c2p and p2c terms over
                relative positions, shared key/query projections, a normed table, no absolute
                positions).

The modern and DeBERTa arms run the XLA attention (and the modern ones the XLA norms and
feed-forward: the GPU kernels are BERT's block);
BERT's arm keeps the recipe's kernels, so its seq/s is the fast path's. Fine-tuning is the other
sweeps' (SST-2, MRPC, STS-B, 3 seeds).

  python -m bert_jax.sweep run --sweep=sweeps/modern_block.py --workdir=runs/modern_block
"""

from sweeps import common

MODERN = {
    'objectives': 'mlm',
    'model': {'name': 'modernbert', 'scan_layers': False, 'attention_impl': 'xla',
              'layer_norm_impl': 'xla', 'ffn_impl': 'xla', 'flat_matmuls': False,
              'type_vocab_size': 1, 'layer_norm_eps': 1e-5, 'intermediate_size': 2048,
              'norm': 'layer_norm', 'use_bias': False, 'feed_forward': 'geglu',
              'positions': 'rotary', 'rope_theta': 160_000.0, 'local_rope_theta': 10_000.0,
              'local_window': 128, 'global_every': 3, 'gelu': 'erf'},
}


DEBERTA = {
    'objectives': 'mlm',
    'model': {'name': 'deberta', 'attention_impl': 'xla', 'type_vocab_size': 1,
              'layer_norm_eps': 1e-7, 'positions': 'none', 'relative_attention': 'c2p|p2c',
              'relative_buckets': 256, 'relative_positions': 0, 'share_relative_key': True,
              'relative_norm': True},
}


def modern(**model) -> dict:
  """MODERN with `model` values changed."""
  return {**MODERN, 'model': {**MODERN['model'], **model}}


def get_config():
  sweep = common.sweep(
      'modern_block', "BERT's block against ModernBERT's and DeBERTa's",
      'One shape (6 layers, 768 wide), MLM on single segments and one pretraining budget in '
      'FLOPs; the modern encoder\'s block, then with one of its switches turned back, and '
      'DeBERTa\'s disentangled attention.')
  common.with_arms(sweep, {
      'bert': {'label': 'BERT block (post-LN)', 'args': 'nsp=False'},
      'modern': {'label': 'modern block', 'pretrain': modern()},
      'modern_r30': {'label': 'modern block, 30% masking', 'args': 'mask_rate=0.3',
                     'pretrain': modern()},
      'modern_absolute': {'label': 'modern block - rotary', 'pretrain': modern(
          positions='absolute')},
      'modern_gelu': {'label': 'modern block - GeGLU', 'pretrain': modern(
          feed_forward='gelu', intermediate_size=3072)},
      'modern_global': {'label': 'modern block - local layers', 'pretrain': modern(
          local_window=0)},
      'deberta': {'label': 'DeBERTa-v3 attention', 'pretrain': DEBERTA},
  })
  sweep.equal_flops = 'bert'
  sweep.notes = [
      'The arms pretrain for equal training FLOPs (steps x batch x model FLOPs per sequence); '
      'attention is counted over the whole row in local layers too, as the masked computation '
      'does it.',
  ]
  return sweep
