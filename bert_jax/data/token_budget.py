"""A pretraining run's schedule in tokens: what its steps train, and the steps a token budget
needs. Pure integers, no jax.

A step trains its rows x their length in tokens, padding included (a pure function of the
step, so schedules and records need no data): phase 1's rows at data.max_seq_length, a
batch-size warmup's smaller batches counted (batch_warmup.py), then phase 2's (the last
round(train.phase2_fraction x num_steps) steps) at data.phase2_max_seq_length and
train.phase2_batch_size. ModernBERT and most encoders since state their schedules in tokens;
`tokens=`, `warmup_tokens=` and `decay_tokens=` (configs/base.py's arguments) turn them into
steps here.
"""

import re

from bert_jax.core.errors import ConfigError
from bert_jax.data import batch_warmup

_SUFFIXES = {'': 1, 'k': 10**3, 'm': 10**6, 'b': 10**9, 'g': 10**9, 't': 10**12}


def phase2_steps(train, num_steps: int | None = None) -> int:
  """Steps of phase 2, the last of the run (0 without one)."""
  num_steps = train.num_steps if num_steps is None else num_steps
  return int(round(train.phase2_fraction * num_steps))


def tokens_through(config, step: int, num_steps: int | None = None) -> int:
  """Tokens trained by steps 1..`step` of `config`'s run (of `num_steps` steps, by default
  train.num_steps: where phase 2 starts depends on it)."""
  train, data = config.train, config.data
  num_steps = train.num_steps if num_steps is None else num_steps
  first = num_steps - phase2_steps(train, num_steps)  # Phase 1's last step.
  tokens = batch_warmup.tokens_through(train, data.max_seq_length, min(step, first))
  if step > first:
    rows = train.phase2_batch_size or train.batch_size
    tokens += (step - first) * rows * data.phase2_max_seq_length
  return tokens


def _first_reaching(trained, tokens: float, low: int, high: int) -> int:
  """The fewest steps in (low, high] with trained(steps) >= tokens, given trained(low) < tokens
  <= trained(high) and trained growing with the steps (bisection)."""
  while high - low > 1:
    middle = (low + high) // 2
    if trained(middle) < tokens:
      low = middle
    else:
      high = middle
  return high


def steps_for_tokens(config, tokens: float) -> int:
  """The fewest steps of a run of `config`'s shapes that trains at least `tokens` (its phases'
  split follows the steps, so the run's length is searched, not divided)."""
  def run_of(steps):
    return tokens_through(config, steps, steps)
  low, high = 0, 1
  while run_of(high) < tokens:
    low, high = high, 2 * high
  return _first_reaching(run_of, tokens, low, high)


def step_reaching(config, tokens: float) -> int:
  """The first step of `config`'s run by which `tokens` are trained (0 for none): a warmup or
  decay stated in tokens, within a run of train.num_steps."""
  if tokens <= 0:
    return 0
  last = config.train.num_steps
  if tokens_through(config, last) < tokens:
    return last + 1  # Past the run: validation says so for the key it sets.
  return _first_reaching(lambda step: tokens_through(config, step), tokens, 0, last)


def readable(tokens: float) -> str:
  """98,304,000 -> '98.3M': a count of tokens as a log line gives it (3 significant digits)."""
  for suffix, size in (('T', 10**12), ('B', 10**9), ('M', 10**6), ('K', 10**3)):
    if tokens >= size:
      return f'{tokens / size:.3g}{suffix}'
  return f'{tokens:g}'


def parse_count(text: str, name: str) -> int:
  """'2B' -> 2,000,000,000: a count of tokens, with an optional K, M, B (or G) or T suffix,
  or in e notation ('1.7e12'). ConfigError naming `name` for anything else or below 1."""
  match = re.fullmatch(r'\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmbgt]?)\s*', text.lower())
  value = float(match.group(1)) * _SUFFIXES[match.group(2)] if match else 0
  if value < 1:
    raise ConfigError(f'Config argument {name}={text!r}: expected a positive number of tokens, '
                      'e.g. 2000000, 2M, 1.7T or 1.7e12.')
  return round(value)
