"""Orbax checkpoints of the train state and the data position, saved atomically.

A step's checkpoint is written to a temporary directory and renamed when complete, so a run
killed mid-save leaves the previous checkpoints intact; old ones are deleted only after a newer
one is complete.
"""

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """Saves {state, data position} every `every` steps, keeps the newest `keep`."""

  def __init__(self, directory: str, every: int, keep: int):
    self.directory = os.path.abspath(directory)
    self.every = every
    self._manager = ocp.CheckpointManager(
        self.directory, item_names=('state', 'data'),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             cleanup_tmp_directories=True))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def restore(self, abstract_state) -> tuple[Any, dict] | None:
    """(state, data position) of the newest checkpoint, or None when there is none."""
    step = self._manager.latest_step()
    if step is None:
      return None
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
    return restored['state'], dict(restored['data'])

  def should_save(self, step: int, final: bool) -> bool:
    return final or (self.every > 0 and step % self.every == 0)

  def save(self, step: int, state, data_position: dict) -> None:
    """Starts an (async) save; the previous save is finished first."""
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_position)), force=True)

  def describe_latest(self) -> str:
    step = self._manager.latest_step()
    if step is None:
      return 'no checkpoint was saved yet'
    return f'last good checkpoint: step {step} in {self.directory}'

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def latest_step(workdir: str) -> int | None:
  """Newest complete checkpoint step in workdir/checkpoints, or None (complete ones are renamed
  from a temporary name, so a half-written save never counts)."""
  directory = os.path.join(workdir, 'checkpoints')
  if not os.path.isdir(directory):
    return None
  steps = [int(name) for name in os.listdir(directory) if name.isdigit()]
  return max(steps) if steps else None


def abstract_like(state, shardings):
  """ShapeDtypeStructs with the given shardings: what restore fills in."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      state, shardings)
