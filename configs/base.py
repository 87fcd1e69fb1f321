"""BERT-Base pretraining with the paper's recipe (Devlin et al., 2018).

Arguments (comma separated, `configs/base.py:layers=6,nsp=False,mask_rate=0.3`):
  layers, hidden, heads, nsp, mask_rate, wwm, seq, batch, steps, warmup, corpus, vocab,
  tokens, warmup_tokens, decay_tokens.
(`nsp=False` drops 'nsp' from config.objectives: single segments, MLM only.)
Arguments carry what depends on them (`apply_pretraining_arguments`): `steps` without `warmup`
keeps the warmup's share of the steps (here 1%, 10k of 1M; at least one step), `warmup=paper`
keeps the config's own warmup in steps (the paper's 10k; refused if longer than the run), and `mask_rate`
or `seq` raise data.max_predictions_per_seq (and, with `mask_rate`, the phase-2 one) in
proportion, rounded up (the paper's 20 at seq 128 and rate 0.15 become 40 at rate 0.3).
The schedule in tokens (rows x their length, padding, a batch-size warmup's smaller batches and
phase 2 counted; bert_jax/data/token_budget.py): `tokens=2B` sets the steps to the fewest that
train 2B tokens, and keeps the warmup's, the decay's and the batch-size warmup's shares of the
config's tokens; `warmup_tokens` and `decay_tokens` set those phases in tokens (K, M, B, T
suffixes or 1.7e12), counted after every other argument (a `seq` or `batch` given changes them).
Everything else: `--config.KEY=VALUE`, e.g. `--config.model.num_layers=6`; such an override is
taken as given, and derives nothing.
"""

import math

from absl import logging
import ml_collections

from bert_jax.data import token_budget
from bert_jax.models import architecture

# Arguments accepted after the colon, and the config key each one sets.
ARGUMENTS = {
    'layers': 'model.num_layers',
    'hidden': 'model.hidden_size',
    'heads': 'model.num_heads',
    'nsp': lambda config, value: _set_objective(config, 'nsp', _parse_bool(value, 'nsp')),
    'mask_rate': 'masking.rate',
    'wwm': 'masking.whole_word',
    'seq': 'data.max_seq_length',
    'batch': 'train.batch_size',
    'steps': 'train.num_steps',
    'warmup': 'train.warmup_steps',
    'corpus': 'data.corpus',
    'vocab': 'data.vocab_file',
}


def get_config(arg=None):
  """Returns the BERT-Base config; `arg` holds ablation overrides."""
  config = ml_collections.ConfigDict()
  config.mode = 'pretrain'  # What main runs: 'pretrain'.
  config.seed = 0  # Seeds parameters, dropout, the data order and the held-out split.
  # Seeds the parameters and dropout alone when >= 0 (the data stay config.seed's): two runs that
  # differ only here train on the same batches, the spread that initialisation alone gives
  # (bert_jax/tools/equivalence.py's yardstick). -1: config.seed.
  config.init_seed = -1
  # Start from these weights (fresh optimizer, step 0): 'hf:DIR', 'tf:PREFIX' or a bert_jax
  # workdir. The model's shape and, unless data.vocab_file is set, the vocab come from it.
  config.init_from = ''
  config.init_resize_vocab = False  # Resize the source's vocab rows to model.vocab_size.
  # With init_from and a data.vocab_file that is not the source's (a new tokenizer): each
  # token takes the source's rows of the same token, a token the source lacks their mean.
  config.init_vocab_by_token = False
  # Pretraining objectives (bert_jax/objectives), comma separated: 'mlm,nsp' is BERT's (sentence
  # pairs, masked LM + next-sentence prediction); 'mlm' alone trains on single segments.
  config.objectives = 'mlm,nsp'

  config.model = model = ml_collections.ConfigDict()
  model.name = 'bert'  # The encoder (bert_jax/models registry).
  model.vocab_size = 30522  # Rows of the word embedding; >= the tokenizer's vocab.
  model.hidden_size = 768  # H.
  # Width of the embedding tables (E), projected to H: ALBERT's factorised embeddings
  # (model.name='albert'); 0 is H, the only width the other families take.
  model.embedding_size = 0
  # Replaced-token detection (config.objectives='rtd'; model.name 'electra' or 'deberta'): the
  # generator's hidden size as a fraction of H (its heads and feed-forward scale with it), and the
  # weight of the discriminator's replaced-token loss beside the generator's MLM loss.
  model.generator_fraction = 0.25
  # The generator's layers as a fraction of num_layers (ELECTRA: 1; DeBERTa-v3: half).
  model.generator_layer_fraction = 1.0
  model.disc_weight = 50.0
  # How the generator and the discriminator share the embedding tables: 'shared' (ELECTRA: one
  # module, both losses train it) or 'gdes' (DeBERTa-v3's gradient-disentangled sharing: the
  # generator's MLM alone trains the tables; the discriminator reads them without a gradient
  # plus deltas of its own, which start at zero, and has its own LayerNorm).
  model.embedding_sharing = 'shared'
  model.num_layers = 12  # L.
  model.num_heads = 12  # A; must divide hidden_size.
  model.intermediate_size = 3072  # Feed-forward width, 4H.
  model.max_position_embeddings = 512  # Learned positions; 512 from the start.
  model.type_vocab_size = 2  # Segment (token type) embeddings.
  model.hidden_dropout_rate = 0.1  # Dropout on embeddings and hidden states.
  model.attention_dropout_rate = 0.1  # Dropout on attention probabilities.
  model.initializer_range = 0.02  # Stddev of the truncated-normal init.
  model.layer_norm_eps = 1e-12  # As the original BERT.
  model.dtype = 'float32'  # Compute dtype ('bfloat16' for speed); softmax and loss stay fp32.
  model.param_dtype = 'float32'  # Storage dtype of parameters and optimizer state.
  model.scan_layers = True  # Run the layers under nn.scan (one compiled layer).
  model.scan_unroll = 1  # Layers per scan iteration; more compiles longer, may run faster.
  model.remat_policy = 'none'  # 'none', 'full', 'dots', 'dots_no_batch': what the backward recomputes.
  # 'erf': exact GELU, as HF computes it; 'tanh': the original TF BERT's approximation (cheaper
  # on GPUs).
  model.gelu = 'erf'
  # Causal attention: each token attends only to itself and earlier tokens, and the pooled output
  # is the last real token's state (a causal [CLS] sees nothing else). For the left-to-right LM
  # objective 'clm' (the paper's Table 5 "LTR & No NSP"); 'mlm' and 'nsp' need False.
  # Attention 'xla' or 'tpu' only; no packed rows.
  model.causal = False
  # How each part is computed (bert_jax/ops dispatches; docs/gpu.md has the kernels):
  # attention 'xla' (einsum softmax with attention dropout; any device), 'cudnn' (cuDNN's fused
  # attention, dropout in the kernel: needs scan_layers=False and remat 'none' while
  # attention_dropout_rate > 0), 'pallas' (bert_jax/kernels/gpu/fused_attention.py for rows of
  # 16-512 tokens, powers of two, packed or not; cuDNN's for other rows) or 'tpu'
  # (bert_jax/kernels/tpu/fused_attention.py, Pallas TPU, dropout in the kernel, causal or not,
  # for rows of 8-512 tokens in multiples of 8, packed or not; 'xla' for other rows) or 'splash'
  # (the modern encoder's local and global layers through JAX's splash attention, Pallas TPU,
  # bert_jax/kernels/tpu/local_attention.py, rows in whole tiles of 128, no dropout).
  model.attention_impl = 'xla'
  # With attention_impl='pallas', the backward of rows over 128 tokens: 'triton' (Pallas Triton)
  # or 'mosaic' (kernels/gpu/flash_backward.py: wgmma and TMA; Hopper GPUs, 16-bit compute).
  model.long_attention_backward = 'triton'
  # The same for rows up to 128 tokens: 'triton' (one program per row and head) or 'mosaic'
  # (flash_backward.row_backward: one block per row and head; rows of 64 or 128, Hopper GPUs).
  model.short_attention_backward = 'triton'
  # PRNG of the dropout masks: 'threefry' (the same masks under any sharding) or 'rbg' (XLA's
  # RngBitGenerator: much cheaper on GPU, masks may differ between meshes).
  model.dropout_rng_impl = 'threefry'
  # Bias + dropout + residual add + LayerNorm after each sublayer: 'xla', or 'pallas' (one
  # Triton kernel each way, kernels/gpu/fused_norm.py; NVIDIA GPUs).
  model.layer_norm_impl = 'xla'
  # The feed-forward block: 'xla', or 'pallas' (two Mosaic GPU kernels, kernels/gpu/fused_ffn.py,
  # on both sides of the GELU; needs gelu='tanh' and a Hopper GPU).
  model.ffn_impl = 'xla'
  # The encoder's dense layers as 2-d [tokens, in] @ [in, out] matmuls + bias (the same function
  # and parameters, another HLO for XLA to fuse; faster on GPUs with layer_norm_impl='pallas').
  model.flat_matmuls = False
  # The modern encoder's switches (model.name='modernbert', pre-norm layers; the other families
  # take the defaults only): norm 'layer_norm' or 'rms_norm'; use_bias False drops the dense
  # layers' and norms' biases; feed_forward 'gelu' (BERT's), 'geglu' or 'swiglu' (gated);
  # positions 'absolute' (learned), 'rotary' (modernbert) or 'none' (modernbert, deberta).
  model.norm = 'layer_norm'
  model.use_bias = True
  model.feed_forward = 'gelu'
  model.positions = 'absolute'
  # The family units' own keys, off: ModernBERT's local windows and rotary thetas, DeBERTa's
  # disentangled attention and enhanced mask decoder (bert_jax/models/<family>/config.py says
  # what each means).
  model.update(architecture.unit_defaults())
  # XLM's language embeddings (model.name='xlm'; 0 elsewhere): rows of a table of learned
  # embeddings, one per language of data.languages, added to each token's by its language id.
  # 0: none (XLM-R).
  model.num_languages = 0

  config.mesh = mesh = ml_collections.ConfigDict()
  mesh.preset = 'data'  # 'data' (replicated params), 'fsdp' (ZeRO-3), 'fsdp_tensor' (+ tensor).
  mesh.data = -1  # Data-parallel axis size; -1 takes the devices the other axes leave.
  mesh.fsdp = 1  # Parameter-sharding axis (also splits the batch).
  mesh.tensor = 1  # Tensor-parallel axis: heads, MLP and vocab (preset fsdp_tensor).
  mesh.dcn_data = 1  # TPU slices the data axis spans over DCN (multi-slice).

  config.data = data = ml_collections.ConfigDict()
  data.corpus = ''  # Files or globs (comma separated, .xz/.gz ok), or 'builtin'.
  data.corpus_format = 'auto'  # 'bert' (sentence per line), 'prose', or 'auto' (by content).
  # 'wordpiece' (BERT), 'bpe' (byte-level BPE, RoBERTa), 'sentencepiece' (unigram, ALBERT) or
  # 'sentencepiece_fairseq' (unigram with fairseq's ids, XLM-R).
  data.tokenizer = 'wordpiece'
  data.vocab_file = ''  # WordPiece vocab.txt; '' trains one on the corpus, cached in the workdir.
  data.lowercase = True  # Uncased model: lowercase and strip accents.
  data.tokenizer_vocab_size = 30522  # Size of a trained tokenizer (when vocab_file is '').
  data.tokenizer_cache_dir = '~/.cache/bert_jax/vocab'  # Trained vocabs by corpus ('' = off).
  data.max_seq_length = 128  # Tokens per example, [CLS] and [SEP]s included.
  data.max_predictions_per_seq = 20  # Masked positions per example (80 at 512).
  data.short_seq_prob = 0.1  # Probability of a shorter target length.
  data.eval_fraction = 0.02  # Share of documents held out for evaluation.
  data.max_documents = 0  # Use at most this many documents (0: all).
  # A corpus prepared by `python -m bert_jax.data.prepare` (a directory): streamed with Grain,
  # each process reading its own documents, instead of data.corpus read into memory.
  data.prepared = ''
  # A mixture of data.prepared's sources, each prepared into DIR/NAME with one vocab:
  # 'NAME:WEIGHT,...' ('wiki:3,books:1'), each epoch drawing each source's documents to its
  # weight's share of the epoch's tokens (bert_jax/data/mixture.py). '': DIR is one corpus.
  data.mixture = ''
  # What a row holds: 'segments', BERT's (text of one document: [CLS] A [SEP] B [SEP] pairs
  # when an objective needs them, else one segment, cut at drawn target lengths) or
  # 'full_sentences', RoBERTa's FULL-SENTENCES (whole sentences filling each row up to
  # max_seq_length, running on into the next document after a separator; no short rows, no
  # pairs, packing or dupe_factor).
  data.rows = 'segments'
  data.packing = False  # Prepared corpora: pack several short pairs into one row.
  data.max_pairs_per_row = 4  # With packing: pairs per row at most (NSP labels per row).
  data.dupe_factor = 0  # 0: dynamic masking (fresh every epoch); N: N fixed-mask passes (paper).
  data.workers = 0  # Prepared corpora: Grain worker processes building batches (0: in-process).
  # Prepared corpora: input streams the documents are split into (0: one per process). A run
  # resumes, with the same batches, on any number of processes that divides it.
  data.input_shards = 0
  # Cross-lingual pretraining (XLM, XLM-R; read in memory): the corpus's languages, comma
  # separated ('en,fr'; a language's id is its index), data.corpus then naming each one's files
  # with '{lang}' ('wiki.{lang}.txt'). '': one corpus, no language ids.
  data.languages = ''
  # With data.languages: parallel text for translation-LM rows (XLM's TLM: a sentence and its
  # translation in one row, positions restarting at the second), comma-separated 'SRC-TGT:FILES'
  # items ('en-fr:para.en-fr.tsv'), each line of FILES a sentence and its translation separated
  # by a tab. '': none (MLM rows only).
  data.parallel = ''
  # With data.languages (unread without): each language's share of an epoch's MLM rows goes as
  # its share of the corpus to this power (XLM: 0.5, XLM-R: 0.3; 1: as the corpus has them).
  data.language_alpha = 1.0
  data.phase2_max_seq_length = 512  # Phase 2 (train.phase2_fraction > 0): tokens per example.
  data.phase2_max_predictions_per_seq = 80  # Phase 2: masked positions per example.

  config.masking = masking = ml_collections.ConfigDict()
  masking.rate = 0.15  # Share of tokens chosen for prediction.
  masking.mask_token_fraction = 0.8  # Of the chosen: replaced by [MASK].
  masking.random_token_fraction = 0.1  # Of the chosen: replaced by a random token.
  masking.keep_fraction = 0.1  # Of the chosen: left unchanged.
  masking.whole_word = False  # Mask every piece of a word together.
  # Mask runs of n tokens (words, with whole_word) together, n <= max_ngram drawn with p(n)
  # proportional to 1/n: ALBERT's n-gram masking (3); 1 masks token by token (or word by word).
  masking.max_ngram = 1
  # SpanBERT's span masking: 'geometric' masks contiguous spans of words (tokens without
  # whole_word), lengths drawn from Geometric(span_p) clipped at max_span, one 80/10/10 decision
  # per span; '' masks as the keys above say.
  masking.spans = ''
  masking.span_p = 0.2  # With spans: the geometric parameter (SpanBERT: 0.2, mean span 3.8 words).
  masking.max_span = 10  # With spans: the longest span in words (SpanBERT: 10).
  # How the held-out set is masked: 'train' as the settings above; 'reference' with the paper's
  # (15% of tokens, 80/10/10, token by token), whatever the run trains with, so that runs of
  # other masking (an ablation sweep's arms) are scored on the same held-out masks.
  masking.eval = 'train'

  config.train = train = ml_collections.ConfigDict()
  train.batch_size = 256  # Global batch, sequences per step.
  # Micro-batches per optimizer step: the step runs batch_size / N sequences at a time and sums
  # their gradients (a large batch on few devices); 1 = the whole batch at once.
  train.grad_accum_steps = 1
  train.num_steps = 1_000_000  # Optimizer steps.
  # Batch-size warmup (ModernBERT's; bert_jax/data/batch_warmup.py): the first steps train
  # batch_warmup_rows sequences, the batch growing by as many at a time (a divisor of
  # batch_size, a multiple of its micro-batches), each size for the same number of steps, to
  # batch_size once the smaller sizes have trained batch_warmup_tokens tokens (rows x
  # data.max_seq_length). 0 and 0: none.
  train.batch_warmup_rows = 0
  train.batch_warmup_tokens = 0
  # Share of num_steps, at the end, trained at the phase-2 shapes (the paper: 0.1 at seq 512;
  # needs data.prepared). One learning-rate schedule spans both phases.
  train.phase2_fraction = 0.0
  train.phase2_batch_size = 0  # Sequences per phase-2 step (0: train.batch_size).
  # Model settings phase 2 changes, 'key=value,...' of config.model keys that shape no parameter:
  # a context extension's rotary theta and local window (ModernBERT's: configs/modernbert.py's
  # theta at 8,192 tokens; docs/pretraining.md). '' = phase 1's model.
  train.phase2_model = ''
  # 'adamw' (the paper's), 'lamb' (You et al., large batches) or 'stableadamw' (AdamW with
  # per-tensor update clipping: Wortsman et al., ModernBERT's).
  train.optimizer = 'adamw'
  train.learning_rate = 1e-4  # Peak learning rate.
  # Linear warmup, then linear decay to 0 at num_steps. The paper fixes the warmup in steps
  # (10,000 of 1M, appendix A.2); `steps=N` keeps its share instead (1%: 30 steps at steps=3000),
  # unless `warmup=` is given (`steps=N,warmup=paper` keeps the paper's 10,000 steps).
  train.warmup_steps = 10_000
  # 'linear': decay from the warmup's end to 0 at num_steps (BERT's). 'wsd': warmup-stable-decay
  # (ModernBERT's trapezoid): the peak until the last train.decay_steps steps, which fall to 0 by
  # train.decay_shape ('linear', 'cosine' or '1-sqrt'). Its schedule up to the decay is the same
  # for any num_steps: a decay branches from a stable-phase checkpoint (docs/pretraining.md).
  train.schedule = 'linear'
  train.decay_steps = 0
  train.decay_shape = 'linear'
  train.weight_decay = 0.01  # Decoupled decay; not on LayerNorm or biases.
  train.adam_b1 = 0.9  # Adam moments (LAMB uses the same three).
  train.adam_b2 = 0.999
  train.adam_eps = 1e-6
  # Storage of Adam's first moment: 'bfloat16' saves 2 bytes per parameter of memory and traffic
  # (the second moment and the master weights stay float32).
  train.adam_mu_dtype = 'float32'
  train.max_grad_norm = 1.0  # Global-norm clipping.
  train.max_nonfinite_skips = 0  # NaN/inf steps skipped before stopping (0: stop at the first).
  # Run-health alarms (bert_jax/train/health.py) are always logged and written to metrics.jsonl;
  # these stop the run (comma separated, 'all', '' for none): discriminator_at_prior,
  # mlm_at_unigram, generator_at_unigram, loss_diverging, loss_spike, nonfinite_steps.
  train.stop_on_alarms = ''
  train.log_every = 100  # Steps between train log lines / metrics.jsonl records.
  train.eval_every = 10_000  # Steps between evaluations (and at the end).
  train.eval_batches = 20  # Held-out batches per evaluation.
  train.checkpoint_every = 10_000  # Steps between checkpoints (and at the end).
  train.keep_checkpoints = 3  # Newest checkpoints kept.
  # WORKDIR/plots/curves.png drawn at the end of the run (python -m bert_jax.plot draws it later).
  train.plots = True
  train.peak_flops = 0.0  # Device peak FLOP/s for MFU; 0 measures a matmul at start.
  # XLA debug options for the train step's compile, 'name=value,...' (e.g.
  # 'xla_gpu_enable_triton_gemm=false'); they apply to that computation only. '' = XLA's defaults.
  train.xla_options = ''
  # JAX's persistent compilation cache: compiled steps kept in this directory (local, or gs:// on
  # Cloud TPU) and read back by the next run of the same step, so a resumed or restarted run (a
  # preempted TPU VM) skips XLA's compile. '' = JAX's default (off unless
  # JAX_COMPILATION_CACHE_DIR is set).
  train.compilation_cache_dir = ''

  # Knowledge distillation (config.objectives='distill', configs/distilbert.py): the teacher and
  # the weights of the loss's terms (bert_jax/objectives/distill.py).
  config.distill = distill = ml_collections.ConfigDict()
  # The teacher's weights, as init_from names them: a bert_jax workdir ('WORKDIR', 'WORKDIR@STEP')
  # or 'hf:DIR'. Loaded whole, frozen; the student starts from its embeddings, MLM head and the
  # layers of teacher_layers. A resumed run takes both from its own checkpoint.
  distill.teacher = ''
  # The teacher's layers the student's start from, comma separated ('0,2,4,7,9,11', one per
  # student layer); '' spreads them evenly from the first to the last (12 -> 6: those six, as
  # DistilBERT's extract_distilbert.py).
  distill.teacher_layers = ''
  distill.temperature = 2.0  # Softens both distributions of the KL term.
  distill.alpha_ce = 5.0  # Weight of T^2 x KL(teacher || student) over the real tokens.
  distill.alpha_mlm = 2.0  # Weight of the student's masked-LM cross-entropy.
  distill.alpha_cos = 1.0  # Weight of 1 - cosine of the last hidden states over the real tokens.
  # The teacher's architecture (config.model's keys), taken from distill.teacher's checkpoint;
  # what AOT and the benchmark build without one. BERT-base by default.
  distill.teacher_model = teacher = ml_collections.ConfigDict()
  teacher.name = 'bert'  # Its encoder (bert_jax/models registry).
  teacher.vocab_size = 30522  # Must be the student's.
  teacher.hidden_size = 768  # Must be the student's.
  teacher.embedding_size = 0
  teacher.num_layers = 12  # At least the student's.
  teacher.num_heads = 12  # Must be the student's.
  teacher.intermediate_size = 3072  # Must be the student's.
  teacher.max_position_embeddings = 512
  teacher.type_vocab_size = 2
  teacher.layer_norm_eps = 1e-12
  teacher.causal = False
  teacher.gelu = 'erf'

  if arg:
    apply_pretraining_arguments(config, arg)
  return config


def apply_pretraining_arguments(config, arg) -> None:
  """Applies ARGUMENTS to a pretraining config, then scales what depends on them.

  The config's own values are the reference: `steps=N` without `warmup` sets the warmup to the
  same share of N (at least 1 step), and `warmup=paper` keeps the config's own warmup steps; `mask_rate` and `seq` raise max_predictions_per_seq to the
  config's value times (seq / its seq) x (rate / its rate), rounded up, and never lower it.
  """
  data, train = config.data, config.train
  steps, warmup, batch_warmup = train.num_steps, train.warmup_steps, train.batch_warmup_tokens
  seq, rate = data.max_seq_length, config.masking.rate
  predictions, phase2_predictions = (data.max_predictions_per_seq,
                                     data.phase2_max_predictions_per_seq)
  arg, paper_warmup = _take_paper_warmup(arg)
  counts, arg = split_arguments(arg, TOKEN_ARGUMENTS)
  given = apply_arguments(config, arg) | ({'warmup'} if paper_warmup else set())
  if 'steps' in given and 'warmup' not in given and 'warmup_tokens' not in counts:
    train.warmup_steps = max(1, round(warmup * train.num_steps / steps))
    logging.info(
        'Config: steps=%d keeps the warmup at %.3g%% of the steps: %d (this config: %d of %d). '
        'warmup=paper keeps %d steps; warmup=N sets it.', train.num_steps,
        100 * warmup / steps, train.warmup_steps, warmup, steps, warmup)
  elif 'steps' in given and 'warmup_tokens' not in counts:
    logging.info('Config: steps=%d with warmup %d steps (%s; this config: %d of %d).',
                 train.num_steps, train.warmup_steps,
                 'the config\'s own, warmup=paper' if paper_warmup else 'as given', warmup, steps)
  if 'steps' in given and batch_warmup:
    # A batch-size warmup keeps its share of the run too (its tokens scale with the steps).
    train.batch_warmup_tokens = max(1, round(batch_warmup * train.num_steps / steps))
    logging.info('Config: steps=%d keeps the batch-size warmup at the same share: %d tokens '
                 '(this config: %d of %d steps).', train.num_steps, train.batch_warmup_tokens,
                 batch_warmup, steps)
  if counts:
    _apply_token_schedule(config, counts, given)
  if 'mask_rate' in given or 'seq' in given:
    data.max_predictions_per_seq = scaled_predictions(
        predictions, data.max_seq_length / seq, config.masking.rate / rate,
        data.max_seq_length * config.masking.rate)
  if 'mask_rate' in given:
    data.phase2_max_predictions_per_seq = scaled_predictions(
        phase2_predictions, 1.0, config.masking.rate / rate,
        data.phase2_max_seq_length * config.masking.rate)
  if data.max_predictions_per_seq != predictions:
    logging.info('Config: seq=%d, mask_rate=%g raise max_predictions_per_seq %d -> %d.',
                 data.max_seq_length, config.masking.rate, predictions,
                 data.max_predictions_per_seq)


# The schedule in tokens, and the steps argument each one stands for.
TOKEN_ARGUMENTS = {'tokens': 'steps', 'warmup_tokens': 'warmup', 'decay_tokens': ''}


def _apply_token_schedule(config, texts: dict, given: set) -> None:
  """tokens=, warmup_tokens=, decay_tokens= (`texts`) turned into steps at the config's
  shapes: `tokens` without `warmup_tokens` (or `warmup`) keeps the warmup's share of the
  config's tokens, and the same for a wsd decay and a batch-size warmup."""
  train = config.train
  counts = {name: token_budget.parse_count(text, name) for name, text in texts.items()}
  for name in counts:
    if TOKEN_ARGUMENTS[name] in given:
      raise ValueError(f'Config arguments {TOKEN_ARGUMENTS[name]}= and {name}= both set how '
                       f'long {"the run" if name == "tokens" else "the warmup"} is; give one.')
  if 'tokens' in counts:
    # The config's own run, at the shapes the other arguments left: the shares to keep.
    total = token_budget.tokens_through(config, train.num_steps)
    warmup = token_budget.tokens_through(config, train.warmup_steps)
    decay = total - token_budget.tokens_through(config, train.num_steps - train.decay_steps)
    share = counts['tokens'] / total
    if train.batch_warmup_tokens:
      train.batch_warmup_tokens = max(1, round(train.batch_warmup_tokens * share))
    train.num_steps = token_budget.steps_for_tokens(config, counts['tokens'])
    if 'warmup' not in given:
      counts.setdefault('warmup_tokens', max(1, round(warmup * share)))
    if train.decay_steps:
      counts.setdefault('decay_tokens', max(1, round(decay * share)))
  total = token_budget.tokens_through(config, train.num_steps)
  if 'warmup_tokens' in counts:
    train.warmup_steps = max(1, token_budget.step_reaching(config, counts['warmup_tokens']))
  if 'decay_tokens' in counts:
    # The decay trains at least decay_tokens: it starts after the last step within the rest.
    stable_end = token_budget.step_reaching(config, total - counts['decay_tokens'])
    if token_budget.tokens_through(config, stable_end) > total - counts['decay_tokens']:
      stable_end -= 1
    train.decay_steps = train.num_steps - max(0, stable_end)
  logging.info('Config: %s: %d steps (%s tokens), warmup %d steps (%s tokens)%s.',
               ', '.join(f'{name}={text}' for name, text in texts.items()), train.num_steps,
               f'{total:,}', train.warmup_steps,
               f'{token_budget.tokens_through(config, train.warmup_steps):,}',
               f', decay {train.decay_steps} steps' if train.decay_steps else '')


# size=tiny of every family config: configs/tiny.py's shape and schedule.
TINY = {'layers': 2, 'hidden': 128, 'heads': 2, 'vocab': 4096, 'seq': 64, 'batch': 32,
        'steps': 2000, 'warmup': 200, 'learning_rate': 1e-3}


def shrink_to_tiny(config) -> None:
  """A family recipe at size=tiny: configs/tiny.py's shape and schedule on the built-in corpus
  (2 layers of 128, a 4,096-piece vocab trained on it, rows of 64, batches of 32, 2,000 steps at
  1e-3 after 200 warmup steps), keeping what makes the recipe its family's: the objectives,
  masking, rows, tokenizer kind, optimizer and the architecture switches, with the feed-forward
  width in the recipe's proportion to H, a factorised embedding at H / 2, and the masked
  positions per row in the recipe's proportion to the row: the tiny BERT's compute per step, for
  a first run of a family on a laptop. Arguments after size= still apply."""
  model, data, train = config.model, config.data, config.train
  width = TINY['hidden'] / model.hidden_size
  extra_rows = max(0, model.vocab_size - data.tokenizer_vocab_size)  # DeBERTa's 100 spare rows.
  model.update(
      num_layers=TINY['layers'], hidden_size=TINY['hidden'], num_heads=TINY['heads'],
      intermediate_size=round(model.intermediate_size * width),
      # A factorised embedding (ALBERT's, ELECTRA's: E < H) at half of H; 0 (E = H) stays 0.
      embedding_size=TINY['hidden'] // 2 if 0 < model.embedding_size < model.hidden_size else 0,
      vocab_size=TINY['vocab'] + extra_rows)
  data.update(
      corpus='builtin', vocab_file='', tokenizer_vocab_size=TINY['vocab'], eval_fraction=0.05,
      max_predictions_per_seq=math.ceil(
          data.max_predictions_per_seq * TINY['seq'] / data.max_seq_length - 1e-9),
      max_seq_length=TINY['seq'])
  train.update(
      batch_size=TINY['batch'], grad_accum_steps=1, batch_warmup_rows=0, batch_warmup_tokens=0,
      num_steps=TINY['steps'],
      warmup_steps=TINY['warmup'], learning_rate=TINY['learning_rate'], log_every=100,
      eval_every=500, eval_batches=10, checkpoint_every=500)


def _take_paper_warmup(arg) -> tuple[str, bool]:
  """(`arg` without a `warmup=paper` item, whether it had one): that value keeps the config's
  own warmup in steps, which `steps=N` would otherwise scale."""
  items = [item for item in (arg or '').split(',')
           if item.replace(' ', '') != 'warmup=paper']
  return ','.join(items), len(items) != len((arg or '').split(','))


def scaled_predictions(predictions: int, seq_ratio: float, rate_ratio: float,
                       expected: float) -> int:
  """Masked positions per example for a new seq length or rate: `predictions` scaled by both
  ratios and rounded up, at least round(`expected`) (what validation asks) and never fewer than
  `predictions`."""
  # The 1e-9 keeps float noise (20 * 0.3 / 0.15 = 40.000000000000004) from rounding up.
  scaled = math.ceil(predictions * seq_ratio * rate_ratio - 1e-9)
  return max(predictions, scaled, int(round(expected)))


def apply_arguments(config, arg, arguments=None) -> set:
  """Applies `key=value,...` arguments (names in `arguments`, default ARGUMENTS) to `config`;
  returns the names given."""
  arguments = ARGUMENTS if arguments is None else arguments
  given = set()
  for item in arg.split(','):
    if not item.strip():
      continue
    name, sep, value = item.partition('=')
    name = name.strip()
    if not sep or name not in arguments:
      raise ValueError(
          f'Unknown config argument {item!r}; valid arguments are '
          f'{", ".join(sorted(arguments))} as name=value.')
    given.add(name)
    if callable(arguments[name]):
      arguments[name](config, value.strip())
      continue
    *parents, leaf = arguments[name].split('.')
    node = config
    for parent in parents:
      node = node[parent]
    node[leaf] = _parse_like(node[leaf], value.strip(), name)
  return given


def split_arguments(arg, names) -> tuple[dict, str]:
  """({name: value} of the `names` arguments in `arg`, the rest for apply_arguments): a config
  file's own arguments (e.g. size=) beside configs/base.py's."""
  own, rest = {}, []
  for item in (arg or '').split(','):
    name, sep, value = item.partition('=')
    if sep and name.strip() in names:
      own[name.strip()] = value.strip()
    elif item.strip():
      rest.append(item)
  return own, ','.join(rest)


def _set_objective(config, name: str, on: bool) -> None:
  """Adds objective `name` to config.objectives, or removes it."""
  names = [n.strip() for n in config.objectives.split(',') if n.strip() and n.strip() != name]
  config.objectives = ','.join(names + [name] if on else names)


def _parse_bool(text, name):
  if text.lower() in ('true', '1', 'yes'):
    return True
  if text.lower() in ('false', '0', 'no'):
    return False
  raise ValueError(f'Config argument {name}={text!r}: expected True or False.')


def _parse_like(current, text, name):
  """Parses `text` to the type of `current`."""
  if isinstance(current, bool):
    return _parse_bool(text, name)
  try:
    return type(current)(text)
  except ValueError:
    raise ValueError(
        f'Config argument {name}={text!r}: expected a {type(current).__name__}.'
    ) from None
