"""Device mesh and logical-axis rules: where each logical axis lives.

Model code names axes (`batch`, `embed`, `vocab`, ...); this module alone maps them onto a mesh
with axes (`data`, `fsdp`, `tensor`). Presets:
  data         parameters replicated; the batch split over data x fsdp.
  fsdp         parameters and optimizer state sharded over fsdp along `embed` (ZeRO-3 style);
               the batch split over data x fsdp.
  fsdp_tensor  fsdp plus Megatron-style tensor parallelism: heads, MLP and vocabulary over tensor.
Rules are tried in order and a mesh axis is used once per array, so the activation constraint
(batch, length, embed) takes `fsdp` for the batch and leaves `embed` whole.
"""

import contextlib
import math

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ('data', 'fsdp', 'tensor')

_BATCH = ('batch', ('data', 'fsdp'))
LOGICAL_AXIS_RULES = {
    'data': (_BATCH,),
    'fsdp': (_BATCH, ('embed', 'fsdp')),
    'fsdp_tensor': (_BATCH, ('heads', 'tensor'), ('mlp', 'tensor'), ('vocab', 'tensor'),
                    ('embed', 'fsdp')),
}


class MeshError(ValueError):
  """A mesh that cannot be built on these devices."""


def mesh_shape(mesh_config, num_devices: int) -> tuple[int, int, int]:
  """(data, fsdp, tensor) sizes; one of them may be -1 to take the remaining devices."""
  sizes = [mesh_config.data, mesh_config.fsdp, mesh_config.tensor]
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise MeshError(f'config.mesh (data={sizes[0]}, fsdp={sizes[1]}, tensor={sizes[2]}): '
                    'sizes must be positive, with at most one -1 (the rest of the devices).')
  known = math.prod(s for s in sizes if s != -1)
  if num_devices % known:
    raise MeshError(f'config.mesh (data={sizes[0]}, fsdp={sizes[1]}, tensor={sizes[2]}) does '
                    f'not divide the {num_devices} devices.')
  sizes = [num_devices // known if s == -1 else s for s in sizes]
  if math.prod(sizes) != num_devices:
    raise MeshError(f'config.mesh (data={sizes[0]}, fsdp={sizes[1]}, tensor={sizes[2]}) has '
                    f'{math.prod(sizes)} devices, but there are {num_devices}; set one axis '
                    'to -1.')
  return tuple(sizes)


def create_mesh(mesh_config, devices=None) -> Mesh:
  """The (data, fsdp, tensor) mesh of config.mesh over `devices` (default: all).

  With mesh_config.dcn_data > 1 (several TPU slices), the data axis spans slices over DCN and the
  other axes stay inside a slice, on ICI.
  """
  devices = jax.devices() if devices is None else list(devices)
  shape = mesh_shape(mesh_config, len(devices))
  slices = mesh_config.dcn_data
  if slices > 1:
    if shape[0] % slices:
      raise MeshError(f'config.mesh.dcn_data={slices} must divide the data axis ({shape[0]}).')
    per_slice = (shape[0] // slices,) + shape[1:]
    grid = mesh_utils.create_hybrid_device_mesh(per_slice, (slices, 1, 1), devices)
  else:
    try:
      grid = mesh_utils.create_device_mesh(shape, devices)
    except (ValueError, AssertionError, NotImplementedError):
      grid = np.asarray(devices).reshape(shape)  # Topology-unaware order (CPU, odd shapes).
  return Mesh(grid, MESH_AXES)


def logical_axis_rules(preset: str):
  if preset not in LOGICAL_AXIS_RULES:
    raise MeshError(f'config.mesh.preset={preset!r}; valid presets are '
                    f'{sorted(LOGICAL_AXIS_RULES)}.')
  return LOGICAL_AXIS_RULES[preset]


def logical_to_sharding(logical_specs, mesh: Mesh, rules):
  """A tree of logical PartitionSpecs -> a tree of NamedShardings."""
  return nn.logical_to_mesh_sharding(logical_specs, mesh, rules)


def ways(mesh, axes) -> int:
  """Devices a PartitionSpec entry (None, a mesh axis name or a tuple of them) splits over."""
  names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
  return math.prod(mesh.shape[name] for name in names)


def indivisible(abstract_tree, shardings) -> list[tuple[str, tuple, int, int, str]]:
  """Arrays a sharding cannot split evenly: (path, shape, dim index, ways, mesh axes) each."""
  problems = []
  flat = jax.tree_util.tree_leaves_with_path(abstract_tree)
  for (path, leaf), leaf_sharding in zip(flat, jax.tree.leaves(shardings)):
    for dim, axes in enumerate(leaf_sharding.spec):
      split = ways(leaf_sharding.mesh, axes)
      if leaf.shape[dim] % split:
        names = (axes,) if isinstance(axes, str) else tuple(axes)
        problems.append((jax.tree_util.keystr(path, simple=True, separator='/'), leaf.shape,
                         dim, split, 'x'.join(names)))
  return problems


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Arrays whose leading axis is the batch: split over data x fsdp."""
  return NamedSharding(mesh, PartitionSpec(('data', 'fsdp')))


def batch_divisor(mesh: Mesh) -> int:
  """The global batch must be a multiple of this."""
  return mesh.shape['data'] * mesh.shape['fsdp']


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


@contextlib.contextmanager
def activation_rules(mesh: Mesh, rules):
  """Mesh and rules in scope while tracing, so the model's logical constraints take effect."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield


def process_rows(global_rows: int, batch_sharding: NamedSharding) -> slice:
  """The rows of a global batch that this process's devices hold (contiguous by construction)."""
  indices = batch_sharding.addressable_devices_indices_map((global_rows,)).values()
  starts = [index[0].start or 0 for index in indices]
  stops = [global_rows if index[0].stop is None else index[0].stop for index in indices]
  return slice(min(starts), max(stops))


def global_batch(batch: dict, batch_sharding: NamedSharding) -> dict:
  """A host batch -> global arrays split over data x fsdp; each process sends only its rows.

  Every process sees the same global batch (the stream is a pure function of the seed) and
  contributes its own rows, so a multi-host run trains on exactly the single-host batches.
  """
  if jax.process_count() == 1:
    return jax.device_put(batch, batch_sharding)
  rows = process_rows(len(next(iter(batch.values()))), batch_sharding)
  return {k: jax.make_array_from_process_local_data(batch_sharding, v[rows], v.shape)
          for k, v in batch.items()}


def global_batch_from_local(batch: dict, batch_sharding: NamedSharding, global_rows: int) -> dict:
  """This process's own rows (a per-process input stream) -> global arrays of global_rows rows."""
  if jax.process_count() == 1:
    return jax.device_put(batch, batch_sharding)
  return {k: jax.make_array_from_process_local_data(batch_sharding, v,
                                                    (global_rows,) + v.shape[1:])
          for k, v in batch.items()}
