"""A registry of named things (encoder families, objectives): register, look up, list.

A name in `builtin` is imported from `package`.<name> the first time it is asked for (the module
registers itself on import; a folder unit's model.py does), so nothing is loaded that a run does
not name.
"""

import importlib


class Registry:
  """Named items (each with a `.name`) of one kind."""

  def __init__(self, kind: str, package: str, builtin: tuple[str, ...]):
    self.kind = kind  # 'model', 'objective': how errors name an item.
    self.package = package  # Where the built-in items' modules live.
    self.builtin = builtin
    self._items = {}

  def register(self, item):
    """Makes `item` available by its name; returns it."""
    self._items[item.name] = item
    return item

  def unregister(self, name: str) -> None:
    """Removes `name` (a test's own item, when the test ends)."""
    self._items.pop(name, None)

  def get(self, name: str):
    """The item called `name`; ValueError naming the valid ones otherwise."""
    if name not in self._items and name in self.builtin:
      module = importlib.import_module(f'{self.package}.{name}')
      if name not in self._items and hasattr(module, '__path__'):
        # A unit that is a folder (models/deberta/) registers from its model.py; its package
        # stays light, for configs and validation.
        importlib.import_module(f'{self.package}.{name}.model')
    if name not in self._items:
      raise ValueError(f'Unknown {self.kind} {name!r}; valid {self.kind}s are '
                       f'{", ".join(self.available())}.')
    return self._items[name]

  def available(self) -> list[str]:
    """Every name get() takes."""
    return sorted(set(self.builtin) | set(self._items))

  def merged(self, field: str) -> dict:
    """The union of every item's `field` (a dict, e.g. the ranges of its config keys)."""
    return {key: value for name in self.available()
            for key, value in getattr(self.get(name), field).items()}


def lazy_attributes(module: str):
  """A unit package's module `__getattr__`: a name the package does not define is `module`'s
  (the unit's model.py), imported when first read, so that the package itself loads without jax.
  The unit's files (config, hf, model) are AttributeErrors until imported, as `from package
  import hf` asks the package first."""
  def getattr_(name):
    if name in ('config', 'hf', 'model') or name.startswith('__'):
      raise AttributeError(name)
    return getattr(importlib.import_module(module), name)
  return getattr_
