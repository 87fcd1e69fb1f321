"""ModernBERT's config rules that need no jax: which layers attend globally. The encoder
(model.py) and the HF layout (hf.py, which writes the pattern as config.json's layer_types) read
it from here. (Its config.model keys move here with restructure step 4.)"""


def is_global(cfg, index: int) -> bool:
  """Whether layer `index` attends over the whole row: every layer without a local window, else
  every global_every-th from the first (ModernBERT's layers 0, 3, 6, ...)."""
  return cfg.local_window <= 0 or index % cfg.global_every == 0
