"""The family's recent members at one shape and one compute budget: DeBERTa (by MLM and by
DeBERTa-v3's replaced-token detection), XLM-R and ModernBERT beside BERT's MLM.

Every arm is configs/small.py's shape (6 layers, 768 wide, 12 heads, seq 128, batch 256) on the
same documents and pretrains for the training FLOPs of BERT's MLM-only arm
(`sweep.equal_flops`). Each arm is its recipe (configs/deberta.py, configs/xlm.py,
configs/modernbert.py) at this shape, with a SentencePiece vocab of 32,000 where the recipe
trains 128,000 (DeBERTa) or 250,002 (XLM-R) on its corpus, so that a sweep prepares its corpora
in minutes:

  bert_mlm     BERT's block by MLM on single segments, WordPiece (the bert-base-uncased vocab):
               the reference.
  deberta      DeBERTa-v3's encoder (disentangled attention over 256 relative buckets, shared
               key/query projections, a normed relative table, no absolute positions) by MLM,
               SentencePiece (ALBERT's ids), cased.
  deberta_rtd  the same encoder by DeBERTa-v3's pretraining: a generator as wide and half as
               deep, gradient-disentangled embedding sharing, every masked position [MASK],
               loss MLM + 50 x RTD.
  xlmr         XLM-R's encoder (RoBERTa's, fairseq positions, no language embeddings) by MLM on
               FULL-SENTENCES rows, SentencePiece with fairseq's ids, cased, RoBERTa's Adam.
  modernbert   the modern block (sweeps/modern_block.py's: pre-LN without biases, GeGLU 2048,
               rotary positions, local and global layers) at ModernBERT's 30% masking, WordPiece.

BERT's arm keeps the recipe's GPU kernels; the others run the XLA path (their blocks are not
the kernels'), so seq/s and MFU compare what a user runs today. Fine-tuning is the other sweeps'
(SST-2, MRPC, STS-B, 3 seeds); DeBERTa-v3's fine-tunes its discriminator.

  python -m bert_jax.sweep run --sweep=sweeps/family_recent.py --workdir=runs/family_recent \
      --sweep.steps=2000 --sweep.finetune.tasks=sst2
"""

from sweeps import common
from sweeps import modern_block

SPM_VOCAB = 32000

DEBERTA = {
    'objectives': 'mlm',
    'model': {**modern_block.DEBERTA['model'], 'vocab_size': SPM_VOCAB},
    'data': {'tokenizer': 'sentencepiece', 'vocab_file': '', 'lowercase': False,
             'tokenizer_vocab_size': SPM_VOCAB},
}
# configs/deberta.py:objective=rtd's switches.
DEBERTA_RTD = {
    **DEBERTA,
    'objectives': 'rtd',
    'model': {**DEBERTA['model'], 'generator_fraction': 1.0, 'generator_layer_fraction': 0.5,
              'disc_weight': 50.0, 'embedding_sharing': 'gdes'},
    'masking': {'mask_token_fraction': 1.0, 'random_token_fraction': 0.0, 'keep_fraction': 0.0},
}
# configs/xlm.py's XLM-R at this shape: RoBERTa's encoder and optimiser settings.
XLMR = {
    'objectives': 'mlm',
    'model': {'name': 'xlm', 'vocab_size': SPM_VOCAB, 'type_vocab_size': 1,
              'max_position_embeddings': 514, 'layer_norm_eps': 1e-5, 'attention_impl': 'xla'},
    'data': {'tokenizer': 'sentencepiece_fairseq', 'vocab_file': '', 'lowercase': False,
             'tokenizer_vocab_size': SPM_VOCAB, 'rows': 'full_sentences'},
    'train': {'adam_b2': 0.98, 'adam_eps': 1e-6},
}


def get_config():
  sweep = common.sweep(
      'family_recent', 'DeBERTa, DeBERTa-v3, XLM-R and ModernBERT beside BERT at equal compute',
      'One shape (6 layers, 768 wide) and one pretraining budget in FLOPs; each arm trains '
      'with its recipe\'s encoder, objective, rows, masking and tokenizer kind, then is '
      'fine-tuned with the same settings and seeds.')
  common.with_arms(sweep, {
      'bert_mlm': {'label': 'BERT (MLM only)', 'args': 'nsp=False'},
      'deberta': {'label': 'DeBERTa-v3 encoder (MLM)', 'pretrain': DEBERTA},
      'deberta_rtd': {'label': 'DeBERTa-v3 (RTD, GDES)', 'pretrain': DEBERTA_RTD},
      'xlmr': {'label': 'XLM-R (MLM, SentencePiece)', 'pretrain': XLMR},
      'modernbert': {'label': 'ModernBERT block (30% masking)', 'args': 'mask_rate=0.3',
                     'pretrain': modern_block.modern()},
  })
  sweep.equal_flops = 'bert_mlm'
  sweep.notes = [
      'The arms pretrain for equal training FLOPs (steps x batch x model FLOPs per sequence), '
      'not equal steps; held-out losses compare only within a tokenizer.',
  ]
  return sweep
