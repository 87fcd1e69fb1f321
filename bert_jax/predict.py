"""`python -m bert_jax.predict`: the command of bert_jax.tools.predict, and its Python API."""

from bert_jax.tools import predict
from bert_jax.tools.predict import PredictError, Predictor, load  # noqa: F401  (the API)

if __name__ == '__main__':
  predict.run_command()
