"""SentencePiece with fairseq's dictionary ids: XLM-R's tokenizer (transformers'
XLMRobertaTokenizer over a `sentencepiece.bpe.model`).

The model is SentencePiece's with its default ids, `<unk> <s> </s>` at 0-2 (XLM-R's file);
fairseq's dictionary puts `<s> <pad> </s> <unk>` at 0-3, every other piece one id above the
model's, and `<mask>` after the last: a model of N pieces gives N + 2 ids (XLM-R: 250,000 and
250,002). Rows are laid out as RoBERTa's: `<s> A </s></s> B </s>`, no segment ids, and a random
replacement never draws a special id. Text goes to the model as it is (lowercased and stripped
of accents with config.data.lowercase); the model applies its own normalisation (XLM-R's:
nmt_nfkc).
"""

import numpy as np

from bert_jax.data import spm
from bert_jax.data.pretraining import SpecialIds

MODEL_NAME = 'sentencepiece.bpe.model'
# fairseq's dictionary: these first, then the model's pieces from its id 3 on, then <mask>.
_FAIRSEQ_FIRST = ('<s>', '<pad>', '</s>', '<unk>')
_MODEL_FIRST = ['<unk>', '<s>', '</s>']  # SentencePiece's default ids, XLM-R's model's.
_MASK = '<mask>'
# spm.py's settings with SentencePiece's default ids and no control symbols (<pad> and <mask>
# are fairseq's, outside the model).
_TRAINER_SETTINGS = {**{k: v for k, v in spm.TRAINER_SETTINGS.items() if k != 'control_symbols'},
                     'unk_id': 0, 'bos_id': 1, 'eos_id': 2, 'pad_id': -1}
TRAINING_SETTINGS = spm.settings_key(_TRAINER_SETTINGS)


class FairseqSentencePieceTokenizer(spm.SentencePieceTokenizer):
  """XLM-R's tokenizer: a SentencePiece model read through fairseq's dictionary."""
  kind = 'sentencepiece_fairseq'
  model_name = MODEL_NAME
  extra_ids = 2  # <pad> and <mask>.
  replace_quotes = False  # XLMRobertaTokenizer keeps `` and ''.

  def _layout(self, model_file: str, model_pieces: list[str]) -> tuple[list[str], SpecialIds]:
    if model_pieces[:3] != _MODEL_FIRST:
      raise ValueError(
          f'{model_file!r} begins with the pieces {model_pieces[:3]}, not {_MODEL_FIRST}: '
          "fairseq's dictionary (XLM-R) reads a model with SentencePiece's default ids."
          + (" It has ALBERT's [CLS]: use config.data.tokenizer='sentencepiece'."
             if '[CLS]' in model_pieces else ''))
    pieces = [*_FAIRSEQ_FIRST, *model_pieces[3:], _MASK]
    return pieces, SpecialIds(pad=1, unk=3, cls=0, sep=2, mask=len(pieces) - 1, separators=2,
                              draws_specials=False, segment_b=False)

  def _from_model_ids(self, ids: np.ndarray) -> np.ndarray:
    # The model's <unk> (0) is fairseq's 3; its pieces from 3 on move up by one. Text never
    # encodes to the model's <s> or </s>.
    return np.where(ids == 0, 3, ids + 1).astype(np.int32)


def load(model_file: str, lowercase: bool) -> FairseqSentencePieceTokenizer:
  return FairseqSentencePieceTokenizer(model_file, lowercase)


def train(documents: list[list[str]], vocab_size: int, lowercase: bool,
          output_dir: str) -> FairseqSentencePieceTokenizer:
  """Trains a unigram model of vocab_size - 2 pieces on the prepared sentences (vocab_size ids
  with <pad> and <mask>), writes output_dir/sentencepiece.bpe.model, loads it."""
  return spm.train_model(FairseqSentencePieceTokenizer, _TRAINER_SETTINGS, documents,
                         vocab_size, lowercase, output_dir)
