"""`python -m bert_jax.aot`: the command of bert_jax.tools.aot."""

from bert_jax.tools import aot

if __name__ == '__main__':
  aot.run_command()
