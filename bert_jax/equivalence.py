"""`python -m bert_jax.equivalence`: the command of bert_jax.tools.equivalence."""

from bert_jax.tools import equivalence

if __name__ == '__main__':
  equivalence.run_command()
