"""Device mesh and logical-axis rules: how logical names map onto devices.

Model code names axes (`batch`, `embed`, `vocab`, ...); this module alone decides where they live.
The `data` preset replicates parameters and splits the batch over every device.
"""

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ('data',)

# Logical axis -> mesh axis. Unlisted axes are replicated.
LOGICAL_AXIS_RULES = {
    'data': (('batch', 'data'),),
}


def create_mesh(devices=None) -> Mesh:
  """A one-axis mesh over all devices, for data parallelism."""
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices).reshape(len(devices)), MESH_AXES)


def logical_axis_rules(preset: str = 'data'):
  return LOGICAL_AXIS_RULES[preset]


def logical_to_sharding(logical_specs, mesh: Mesh, rules):
  """A tree of logical PartitionSpecs -> a tree of NamedShardings."""
  return nn.logical_to_mesh_sharding(logical_specs, mesh, rules)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Arrays whose leading axis is the batch: split over the data axis."""
  return NamedSharding(mesh, PartitionSpec('data'))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())
