"""The family at one shape and one compute budget: BERT against RoBERTa, ALBERT and ELECTRA.

Every arm is configs/small.py's shape (6 layers, 768 wide, 12 heads, seq 128, batch 256) on the
same documents, and pretrains for the same training FLOPs: BERT for the recipe's steps, the
others for the steps at which steps x batch x model_flops_per_sequence matches BERT's
(`sweep.equal_flops`; RoBERTa's 50k-token output layer costs more a sequence, so it takes
fewer steps; ALBERT's 128-wide head less, so it takes more). What each arm changes:

  BERT     MLM + NSP, WordPiece (the bert-base-uncased vocab).
  BERT MLM MLM alone on single segments, WordPiece: the MLM-only model that ELECTRA's paper
           compares its discriminator with at equal compute.
  RoBERTa  MLM alone on FULL-SENTENCES rows, a byte-level BPE of 50,265 tokens trained on the
           corpus (cased), fairseq's positions and one segment row, Adam beta2 0.98, eps 1e-6.
  ALBERT   MLM + SOP, n-gram masking (n <= 3), 128-wide factorised embeddings, one layer's
           parameters shared by all six, a SentencePiece vocab of 30,000 trained on the corpus
           (lowercased).
  ELECTRA  replaced-token detection: a generator a third as wide (256, 4 heads) fills the
           masked positions ([MASK] 85%, kept 15%) with samples, the discriminator tells every
           token replaced or not (loss: MLM + 50 x RTD); WordPiece as BERT, Adam eps 1e-6.

Everything else is the recipe's (learning rate, schedule, dropout, the Hopper kernels). Each
tokenizer's arm streams its own prepared copy of the corpus. Fine-tuning is the other sweeps'
(SST-2, MRPC, STS-B, 3 seeds); each checkpoint is fine-tuned with its own tokenizer.

  python -m bert_jax.sweep run --sweep=sweeps/family.py --workdir=runs/family
"""

from sweeps import common

ROBERTA = {
    'objectives': 'mlm',
    'model': {'name': 'roberta', 'vocab_size': 50265, 'type_vocab_size': 1,
              'max_position_embeddings': 514, 'layer_norm_eps': 1e-5},
    'data': {'tokenizer': 'bpe', 'vocab_file': '', 'lowercase': False,
             'tokenizer_vocab_size': 50265, 'rows': 'full_sentences'},
    'train': {'adam_b2': 0.98, 'adam_eps': 1e-6},
}
ALBERT = {
    'objectives': 'mlm,sop',
    'masking': {'max_ngram': 3},
    'model': {'name': 'albert', 'vocab_size': 30000, 'embedding_size': 128},
    'data': {'tokenizer': 'sentencepiece', 'vocab_file': '', 'lowercase': True,
             'tokenizer_vocab_size': 30000},
}

# ELECTRA-base's recipe at the shape: the generator a third of the width, the discriminator's
# loss weighted 50, masked positions [MASK] 85% and kept 15%, Adam eps 1e-6; BERT's vocab.
ELECTRA = {
    'objectives': 'rtd',
    'model': {'name': 'electra', 'generator_fraction': 1 / 3, 'disc_weight': 50.0},
    'masking': {'mask_token_fraction': 0.85, 'random_token_fraction': 0.0,
                'keep_fraction': 0.15},
    'train': {'adam_eps': 1e-6},
}


def get_config():
  sweep = common.sweep(
      'family', 'BERT, RoBERTa, ALBERT and ELECTRA at equal compute',
      'One shape (6 layers, 768 wide) and one pretraining budget in FLOPs; each arm trains '
      'with its paper\'s objectives, rows, masking, tokenizer and Adam settings, then is '
      'fine-tuned with the same settings and seeds.')
  common.with_arms(sweep, {
      'bert': {'label': 'BERT (MLM + NSP)'},
      'bert_mlm': {'label': 'BERT (MLM only)', 'args': 'nsp=False'},
      'roberta': {'label': 'RoBERTa (MLM, full sentences, BPE)', 'pretrain': ROBERTA},
      'albert': {'label': 'ALBERT (MLM + SOP, E=128, shared layers)', 'pretrain': ALBERT},
      'electra': {'label': 'ELECTRA (RTD, generator 1/3 wide)', 'pretrain': ELECTRA},
  })
  sweep.equal_flops = 'bert'
  sweep.notes = [
      'The arms pretrain for equal training FLOPs (steps x batch x model FLOPs per sequence, '
      'the report\'s budget column), not equal steps.',
  ]
  return sweep
