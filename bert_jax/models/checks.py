"""Config checks more than one family shares (no jax: validation loads this without the
encoders)."""


def segmentless_xla_problems(config, objective_names, kernels: tuple = ()) -> list[str]:
  """What the modern encoder and DeBERTa both refuse: an attention other than 'xla' or
  `kernels` (their windows and relative terms are attention biases) and sentence objectives (no
  segments)."""
  problems = []
  if config.model.attention_impl not in ('xla', *kernels):
    problems.append(f'attention_impl={config.model.attention_impl!r}: its attention takes a bias '
                    "the kernels do not; set attention_impl=" + ' or '.join(
                        repr(k) for k in ('xla', *kernels)))
  sentence = [n for n in objective_names if n in ('nsp', 'sop')]
  if sentence:
    problems.append(f'objectives {config.objectives!r}: it has no segment embeddings for '
                    f"{', '.join(sentence)}; use 'mlm' or 'rtd'")
  return problems
