"""Where a compiled TPU step's bytes and time go, by part of the model (bert_jax.aot).

libtpu's cost analysis gives one total of bytes accessed and, per instruction of the optimised
program, its own estimate of the instruction's cycles (`estimated_cycles` in the instruction's
backend config). Neither says which part of the model an instruction computes; the instruction's
`op_name` metadata does: JAX writes the Flax module path into it (`.../bert/encoder/layer_3/
attention/...`), `transpose(jvp(...))` for the backward pass, and the optimizer's update is traced
outside the model. This module reads the program's text and sums, per part, the HBM bytes of each
top-level instruction (its operands plus its result, the count XLA's cost analysis makes per
instruction) and its estimated cycles. The parts' bytes are this module's own count, not
libtpu's: `aot` reports their sum beside libtpu's total so that the coverage is visible.

A module of its own, without flags, so that tests import it beside the command modules.
"""

import math
import re

# Reported in this order; every instruction lands in exactly one part.
PARTS = ('attention', 'feed_forward', 'norms', 'embeddings', 'heads_and_loss', 'optimizer',
         'collectives', 'copies', 'other')

_ELEMENT_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 's16': 2, 'u16': 2, 'bf16': 2, 'f16': 2,
                  's32': 4, 'u32': 4, 'f32': 4, 's64': 8, 'u64': 8, 'f64': 8}
_ARRAY = re.compile(r'\b(pred|bf16|[suf]\d+)\[([\d,]*)\]')
# `%name = TYPE opcode(operands), attributes` inside a computation.
_INSTRUCTION = re.compile(r'^\s+(?:ROOT )?%(\S+) = (.*?) ([a-z][a-z0-9-]*)\((.*?)\)(, .*)?$')
_OPERAND = re.compile(r'%([\w.-]+)')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')

# Bookkeeping that moves no bytes of its own, or whose work is counted in the computations it
# calls (while, call, conditional bodies are walked themselves).
_NO_WORK = frozenset({'parameter', 'tuple', 'get-tuple-element', 'constant', 'bitcast', 'while',
                      'call', 'conditional', 'after-all', 'partition-id', 'replica-id'})
# An asynchronous copy or slice is one transfer: its -start reads and its -done writes the
# same bytes, so only the -done counts.
_ASYNC_STARTS = frozenset({'copy-start', 'slice-start'})
_COLLECTIVES = ('all-reduce', 'all-gather', 'reduce-scatter', 'collective-permute', 'all-to-all')


def array_bytes(type_text: str) -> int:
  """Bytes of every array in an HLO type (`bf16[8,128]{...}` or a tuple of them)."""
  return sum(_ELEMENT_BYTES.get(dtype, 4) * math.prod(int(d) for d in dims.split(',') if d)
             for dtype, dims in _ARRAY.findall(type_text))


def part_of(opcode: str, op_name: str) -> str:
  """The part of the step an instruction belongs to, from its opcode and op_name metadata."""
  if opcode.startswith(_COLLECTIVES):
    return 'collectives'
  if opcode.startswith(('copy', 'slice-done')) and not op_name:
    return 'copies'  # Transfers XLA scheduled itself (e.g. prefetches): no source op.
  path = op_name.split('/')
  if any('LayerNorm' in p or 'layer_norm' in p or p.endswith('_norm') for p in path):
    return 'norms'
  if any(p == 'attention' or p.startswith('attention_') or p.endswith('attention')
         for p in path):
    return 'attention'
  if any(p in ('intermediate', 'output', 'ffn', 'mlp') for p in path):
    return 'feed_forward'
  if 'embeddings' in path or 'embedding_projection' in path:
    return 'embeddings'
  if 'jvp(' in op_name or 'transpose(' in op_name:
    return 'heads_and_loss'  # In the differentiated loss but in no encoder module.
  if op_name:
    return 'optimizer'  # Traced in the step outside the loss: the gradient transformation.
  return 'other'


def step_parts(hlo_text: str) -> dict:
  """{part: {'bytes': B, 'cycles': C}} over the program's top-level instructions.

  Instructions inside fusions are not visited (the fusion is one instruction, as in XLA's
  cost analysis); a loop's body is counted once, as there too.
  """
  computations, current = {}, None
  for line in hlo_text.splitlines():
    if line.endswith('{') and not line.startswith(' '):
      current = 'ENTRY' if line.startswith('ENTRY') else line.split()[0]
      computations[current] = []
    elif current is not None:
      match = _INSTRUCTION.match(line)
      if match:
        computations[current].append(match.groups())
  called_inside_fusions = _fused_computations(hlo_text)
  parts = {part: {'bytes': 0, 'cycles': 0} for part in PARTS}
  for name, instructions in computations.items():
    if name in called_inside_fusions:
      continue
    types = {instruction[0]: instruction[1] for instruction in instructions}
    for _, type_text, opcode, operands, attributes in instructions:
      if opcode in _NO_WORK or opcode in _ASYNC_STARTS:
        continue
      attributes = attributes or ''
      op_name = _OP_NAME.search(attributes)
      part = parts[part_of(opcode, op_name.group(1) if op_name else '')]
      if opcode.endswith('-done'):  # Its operand is the start's (output, source, context).
        part['bytes'] += 2 * array_bytes(type_text)
      else:
        part['bytes'] += array_bytes(type_text) + sum(
            array_bytes(types.get(operand, '')) for operand in _OPERAND.findall(operands))
      cycles = _CYCLES.search(attributes)
      part['cycles'] += int(cycles.group(1)) if cycles else 0
  return parts


def _fused_computations(hlo_text: str) -> set:
  """Names of the computations that fusions (and reductions, sorts, maps) call: their
  instructions are a fused instruction's inside, not work of their own."""
  inside = set()
  for match in re.finditer(r'(?:calls|to_apply|comparator)=(%[\w.-]+)', hlo_text):
    inside.add(match.group(1))
  # A while loop's body and condition, and a call's computation, are work of their own.
  for match in re.finditer(r'(?:body|condition)=(%[\w.-]+)', hlo_text):
    inside.discard(match.group(1))
  for match in re.finditer(r' call\([^)]*\)[^\n]*?to_apply=(%[\w.-]+)', hlo_text):
    inside.discard(match.group(1))
  return inside


def combine(one: dict, two: dict, extra_layers: int) -> dict:
  """Parts with every layer counted, from 1- and 2-layer probes: p(1) + extra * (p(2) - p(1))."""
  return {part: {key: one[part][key] + extra_layers * (two[part][key] - one[part][key])
                 for key in one[part]} for part in one}


def shares(parts: dict, key: str) -> dict:
  """Each part's share of the total of `key` ('bytes' or 'cycles'), rounded to 0.1%."""
  total = sum(part[key] for part in parts.values())
  return {name: round(part[key] / total, 3) if total else 0.0 for name, part in parts.items()}


def summed(parts: dict, key: str) -> int:
  return sum(part[key] for part in parts.values())

