"""A tiny BERT on the built-in corpus: learns visibly in a few minutes on 2 CPU cores.

Takes the arguments of configs/base.py; `steps=N` keeps the warmup at 10% of the steps (200 of
2000) unless `warmup` is given.
"""

from configs import base


def get_config(arg=None):
  config = base.get_config()
  config.model.update(
      vocab_size=8192, hidden_size=128, num_layers=2, num_heads=2,
      intermediate_size=512, max_position_embeddings=128)
  # Docstring sentences are short: 64 tokens hold most pairs and halve the compute.
  config.data.update(corpus='builtin', tokenizer_vocab_size=8192, max_seq_length=64,
                     max_predictions_per_seq=10, eval_fraction=0.05)
  config.train.update(
      batch_size=32, num_steps=2000, learning_rate=1e-3, warmup_steps=200,
      log_every=100, eval_every=500, eval_batches=10, checkpoint_every=500)
  if arg:
    base.apply_pretraining_arguments(config, arg)
  return config
