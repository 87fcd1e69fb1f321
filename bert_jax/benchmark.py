"""`python -m bert_jax.benchmark`: the command of bert_jax.tools.benchmark."""

from bert_jax.tools import benchmark

if __name__ == '__main__':
  benchmark.run_command()
