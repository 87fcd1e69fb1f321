"""Pallas TPU (Mosaic) kernels, loaded only when a config value chooses them (bert_jax.ops)."""
