"""bert_jax: BERT pretraining and fine-tuning in JAX/Flax, TPU first."""
