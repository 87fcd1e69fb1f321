"""The costs that Mosaic kernels declare, read from a compiled TPU program (bert_jax.aot).

XLA cannot see inside a Mosaic kernel (a pallas_call compiled for TPUs): the kernel reaches the
compiled program as a custom call whose backend config carries the pallas_call's cost_estimate,
and libtpu's cost analysis takes that declaration as the kernel's cost, FLOPs and bytes exactly
(a kernel with none costs nothing there). Summing the declarations shows how much of libtpu's
FLOPs, bytes and step time rests on them. A module of its own, without flags, so that tests
import it beside the command modules.
"""

import json
import re

# The custom call of a Mosaic kernel; its backend config holds the declaration as JSON,
# "cost_estimate":{"flops":"N","transcendentals":"N","bytes_accessed":"N",...}.
MOSAIC_CALL = 'custom_call_target="tpu_custom_call"'
_DECLARED_COST = re.compile(r'"cost_estimate":(\{[^{}]*\})')


def kernel_cost(hlo_text: str) -> dict:
  """{'kernel_flops', 'kernel_bytes', 'kernel_calls'} of a compiled program's text.

  Each Mosaic call instruction counts once, as libtpu's cost analysis counts each instruction (a
  while loop's body once), so these are the part of that analysis' FLOPs and bytes that the
  kernels declare. A kernel that declares nothing adds a call and no cost.
  """
  flops = bytes_ = calls = 0
  for line in hlo_text.splitlines():
    if MOSAIC_CALL not in line:
      continue
    calls += 1
    match = _DECLARED_COST.search(line)
    if match:
      declared = json.loads(match.group(1))
      flops += int(declared.get('flops', 0))
      bytes_ += int(declared.get('bytes_accessed', 0))
  return {'kernel_flops': float(flops), 'kernel_bytes': float(bytes_), 'kernel_calls': calls}
