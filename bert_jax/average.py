"""`python -m bert_jax.average`: the command of bert_jax.tools.average."""

from bert_jax.tools import average

if __name__ == '__main__':
  average.main()
