"""Running a kernel on each device's block of the activations under shard_map.

The Pallas kernels see one device's arrays; on a mesh of several devices each device runs them on
its rows of the batch (and heads), with parameters whole and their gradients summed by
shard_map's transpose.
"""

import flax.linen as nn
import jax

from bert_jax import sharding


def splits_heads() -> bool:
  """Whether the current mesh splits the 'heads' logical axis over several devices."""
  mesh = jax.sharding.get_abstract_mesh()
  return not mesh.empty and sharding.ways(mesh, nn.logical_to_mesh_axes(('heads',))[0]) > 1


def splitting_mesh(x, spec):
  """The mesh when it splits activation x (PartitionSpec spec) over several devices, for a
  kernel to run per device under shard_map; None on one device or when the mesh cannot split x
  (init's batch of 1): then the kernel runs on the whole array."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1 or sharding.indivisible(
      jax.ShapeDtypeStruct(x.shape, x.dtype), jax.sharding.NamedSharding(mesh, spec)):
    return None
  return mesh


def on_each_device(kernel, args, in_specs, out_specs, *, whole: dict, setting: str):
  """kernel(*args), on a mesh of several devices under shard_map: each device runs it on its
  block of the activations (in_specs, out_specs: PartitionSpecs of args and the result, args[0]
  the activation that decides; parameters whole, their gradients summed by shard_map's
  transpose). On one device, or where the mesh cannot split args[0] (init's batch of 1), kernel
  runs on the whole arrays. whole: {what: mesh axes the rules map it to} for what the kernels
  need unsplit; a ValueError naming `setting` when the rules split one."""
  mesh = splitting_mesh(args[0], in_specs[0])
  if mesh is None:
    return kernel(*args)
  split = {what: axes for what, axes in whole.items() if axes is not None}
  if split:
    raise ValueError(f"{setting} needs whole {' and '.join(split)}; the mesh rules split them "
                     f"over {' / '.join(map(repr, split.values()))}.")
  return jax.shard_map(kernel, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                       check_vma=False)(*args)
