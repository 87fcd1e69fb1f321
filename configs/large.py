"""BERT-Large: configs/base.py with L=24, H=1024, A=16, feed-forward 4096."""

from configs import base


def get_config(arg=None):
  config = base.get_config()
  config.model.num_layers = 24
  config.model.hidden_size = 1024
  config.model.num_heads = 16
  config.model.intermediate_size = 4096
  if arg:
    base.apply_pretraining_arguments(config, arg)
  return config
