"""XLM-R's and XLM's encoder (models registry name 'xlm'): RoBERTa's, with language embeddings.

XLM-R (Conneau et al., 2020) is RoBERTa's architecture over one SentencePiece vocab of 250,002
pieces shared by 100 languages, without language embeddings: an XLMRobertaForMaskedLM checkpoint
maps row for row (fairseq's positions from 2, one segment row). XLM (Lample and Conneau, 2019)
adds a learned embedding of each token's language to its token and position embeddings, before
the LayerNorm: model.num_languages > 0 gives that table, `bert/embeddings/language_embeddings`
[num_languages, embed], read by the batch's `language_ids`; 0 (XLM-R) gives none. Translation-LM
rows (data/crosslingual.py) bring position_ids that restart at their second sentence.
"""

from bert_jax import models
from bert_jax.models import bert
from bert_jax.models import roberta
from bert_jax.models.xlm import hf as xlm_hf

FAMILY = models.register(models.Family(
    name='xlm', config_from=roberta.config_from, encoder=bert.BertModel,
    flops=bert.encoder_flops, inputs=('language_ids',), position_offset=roberta.POSITION_OFFSET,
    hf=xlm_hf.LAYOUT))
