"""RoBERTa's encoder (models registry name 'roberta'): BERT's, with fairseq's positions.

Liu et al. (2019) keep BERT's architecture; what differs is configuration (configs/roberta.py:
one segment row, LayerNorm eps 1e-5, 514 position rows, the BPE vocab) and the position ids,
which fairseq counts from padding_idx + 1 = 2 over real tokens only (padding reads row 1), so a
RobertaForMaskedLM checkpoint's position table maps row for row. The MLM head is `predictions`
(HF's lm_head: dense, gelu, LayerNorm, tied decoder + bias); RoBERTa has no NSP.
"""

import dataclasses

from bert_jax import models
from bert_jax.models import bert
from bert_jax.models.encoder import EncoderConfig
from bert_jax.models.roberta import hf as roberta_hf

# fairseq's padding_idx (the <pad> id of RoBERTa's vocab) + 1: the first real token's row.
POSITION_OFFSET = 2


def config_from(config) -> EncoderConfig:
  """The run's ConfigDict -> BERT's config with RoBERTa's position numbering."""
  return dataclasses.replace(EncoderConfig.from_config(config), position_offset=POSITION_OFFSET)


FAMILY = models.register(models.Family(name='roberta', config_from=config_from,
                                       encoder=bert.BertModel, flops=bert.encoder_flops,
                                       position_offset=POSITION_OFFSET, hf=roberta_hf.LAYOUT))
