"""`python -m bert_jax.convert`: the command of bert_jax.tools.convert."""

from bert_jax.tools import convert

if __name__ == '__main__':
  convert.run_command()
