"""BERT-Base or BERT-Large set up for one TPU generation: `configs/tpu.py:gen=v5e,size=large`.

Arguments: gen (v3, v4, v5e, v5p, v6e), size (base, large), seq (128 or 512: the paper's phase
1 or phase 2 rows, with 20 or 80 masked positions), and the pretraining arguments of
configs/base.py (`steps`, `corpus`, ...). The model, data and optimizer are the paper's
(configs/base.py, configs/large.py) at its batch of 256; what the generation changes is how the
same step is computed and laid out, each choice measured by compiling the step for the
generation with libtpu (`python -m bert_jax.aot`; experiments/aot_table.py, setups
`tpu-GEN-SIZE-SEQ`; docs/tpu.md has the table):
- bf16 compute, fp32 master weights and Adam state;
- attention in the Pallas TPU kernels (attention_impl='tpu'), the paper's attention dropout
  drawn inside them (v4 and later: v3 keeps the XLA attention, V3_ATTENTION);
- the hidden states' dropout masks from threefry, as everywhere else: with XLA's
  RngBitGenerator ('rbg') libtpu's estimate of a BERT-Large layer at 512 tokens on v5e moved
  twice the bytes (4.5 GB against 2.1 GB per layer at 4 rows per chip);
- SLICES: the slice the 256 rows are spread over, hence the rows per chip, with the mesh preset
  and the remat policy that make them fit the chip's HBM. Fewer chips keep more rows on each,
  which spreads the parameters' and optimizer's fixed traffic over more tokens: the paper's
  batch on the slice named here costs the fewest chip-hours; a larger slice of the same
  generation finishes sooner at a lower MFU (`--config.mesh.*` and the slice are yours to change).

Launch with `launch_tpu.sh create --accelerator-type=...` for the slice in SLICES (a `vN:AxB`
topology is accelerator type `vN-(chips, or cores on v3)`) and `run -- --config=configs/tpu.py:...`.
"""

import dataclasses

from configs import base
from configs import large


@dataclasses.dataclass(frozen=True)
class Slice:
  """Where and how the paper's batch runs on one generation."""
  topology: str  # The slice, as bert_jax.aot's --topology names it.
  preset: str = 'data'  # config.mesh.preset.
  fsdp: int = 1  # config.mesh.fsdp (preset 'fsdp').
  remat_policy: str = 'none'  # config.model.remat_policy.
  attention_impl: str = 'tpu'  # config.model.attention_impl.


# Mosaic does not compile the attention kernels' bf16 matmuls for v3 ("Unsupported matmul RHS
# type on target: vector<128x128xbf16>", libtpu 0.0.42.1): v3 keeps the XLA attention.
V3_ATTENTION = 'xla'

# (generation, size, seq) -> Slice. The rule: as many rows per chip as the chip's HBM holds
# without rematerialisation, in a power of two, the 256 rows then set the slice. The setups
# that experiments/aot_table.py compiled (tpu-GEN-SIZE-SEQ) are in docs/tpu.md's table.
SLICES = {
    # 8 rows per core (a v3 device is one core).
    ('v3', 'base', 128): Slice('v3:4x4', attention_impl=V3_ATTENTION),
    ('v3', 'base', 512): Slice('v3:4x4', attention_impl=V3_ATTENTION),
    ('v3', 'large', 128): Slice('v3:4x4', attention_impl=V3_ATTENTION),
    ('v3', 'large', 512): Slice('v3:4x8', attention_impl=V3_ATTENTION),  # 4 rows per core.
    ('v4', 'base', 128): Slice('v4:2x2x1'),  # 64 rows per chip.
    ('v4', 'base', 512): Slice('v4:2x2x2'),  # 32.
    ('v4', 'large', 128): Slice('v4:2x2x1'),
    ('v4', 'large', 512): Slice('v4:2x2x4'),  # 16.
    ('v5e', 'base', 128): Slice('v5e:2x2'),  # 64.
    ('v5e', 'base', 512): Slice('v5e:4x4'),  # 16.
    ('v5e', 'large', 128): Slice('v5e:2x4'),  # 32.
    ('v5e', 'large', 512): Slice('v5e:4x8'),  # 8.
    ('v5p', 'base', 128): Slice('v5p:2x2x1'),  # 64.
    ('v5p', 'base', 512): Slice('v5p:2x2x1'),
    ('v5p', 'large', 128): Slice('v5p:2x2x1'),
    ('v5p', 'large', 512): Slice('v5p:2x2x2'),  # 32.
    ('v6e', 'base', 128): Slice('v6e:2x2'),  # 64.
    ('v6e', 'base', 512): Slice('v6e:2x4'),  # 32.
    ('v6e', 'large', 128): Slice('v6e:2x2'),
    ('v6e', 'large', 512): Slice('v6e:4x4'),  # 16.
}

GENERATIONS = ('v3', 'v4', 'v5e', 'v5p', 'v6e')
SIZES = ('base', 'large')
SEQS = (128, 512)
OWN_ARGUMENTS = ('gen', 'size', 'seq')


def get_config(arg=None):
  own, rest = base.split_arguments(arg, OWN_ARGUMENTS)
  gen, size, seq = own.get('gen', 'v5e'), own.get('size', 'large'), own.get('seq', '512')
  if gen not in GENERATIONS:
    raise ValueError(f'Unknown TPU generation gen={gen!r}; valid: {", ".join(GENERATIONS)}.')
  if size not in SIZES:
    raise ValueError(f'Unknown size={size!r}; valid: {", ".join(SIZES)}.')
  if not seq.isdigit() or int(seq) not in SEQS:
    raise ValueError(f'seq={seq!r} has no TPU settings; valid: {", ".join(map(str, SEQS))}.')
  seq = int(seq)
  config = large.get_config() if size == 'large' else base.get_config()
  choice = SLICES[(gen, size, seq)]
  config.model.update(dtype='bfloat16', attention_impl=choice.attention_impl,
                      remat_policy=choice.remat_policy)
  config.mesh.update(preset=choice.preset, fsdp=choice.fsdp)
  config.data.update(max_seq_length=seq, max_predictions_per_seq=20 if seq == 128 else 80)
  if rest:
    base.apply_pretraining_arguments(config, rest)
  return config
