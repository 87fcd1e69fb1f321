"""Workdir files on a local disk or in Cloud Storage (`gs://BUCKET/...`), one set of calls.

Local paths go to os/open() exactly as before (nothing is imported or wrapped for them); URLs go
to fsspec's `gcsfs`. Orbax reaches the same objects through etils.epath and tensorstore: see
docs/workdir.md for the settings each library reads.
Cloud Storage has objects, not files: a write replaces the whole object when it is closed (so a
reader never sees half of one), nothing can be appended, and a "directory" is a name prefix that
exists while an object carries it.
"""

import atexit
import builtins
import functools
import json
import os
import shutil
import tempfile
import time


def is_url(path: str) -> bool:
  """Whether `path` names an object store (gs://...) rather than a local file."""
  return '://' in str(path)


def absolute(path: str) -> str:
  """A local path with ~ expanded, made absolute; a URL as it is (without a trailing /)."""
  if is_url(path):
    return path.rstrip('/')
  return os.path.abspath(os.path.expanduser(path))


@functools.cache
def _filesystem():
  """The gcsfs filesystem; an emulator (STORAGE_EMULATOR_HOST) is reached without credentials.
  Listings are not cached: another process (a resumed run, orbax) changes the bucket."""
  import fsspec  # pylint: disable=g-import-not-at-top
  token = 'anon' if os.environ.get('STORAGE_EMULATOR_HOST') else None
  return fsspec.filesystem('gs', token=token, use_listings_cache=False, skip_instance_cache=True)


# pylint: disable-next=redefined-builtin
def open(path: str, mode: str = 'r', encoding: str | None = None):
  """open(); a URL opened for writing becomes the object when the file is closed."""
  if not is_url(path):
    return builtins.open(path, mode, encoding=encoding)
  if 'b' not in mode:
    return _filesystem().open(path, mode, encoding=encoding or 'utf-8')
  return _filesystem().open(path, mode)


def exists(path: str) -> bool:
  return _filesystem().exists(path) if is_url(path) else os.path.exists(path)


def isfile(path: str) -> bool:
  return _filesystem().isfile(path) if is_url(path) else os.path.isfile(path)


def isdir(path: str) -> bool:
  """A local directory, or a URL prefix that some object carries."""
  return _filesystem().isdir(path) if is_url(path) else os.path.isdir(path)


def listdir(path: str) -> list[str]:
  """The names (not paths) directly under `path`; [] for a URL prefix no object carries."""
  if not is_url(path):
    return os.listdir(path)
  try:
    entries = _filesystem().ls(path, detail=False)
  except FileNotFoundError:
    return []
  return sorted({entry.rstrip('/').rsplit('/', 1)[-1] for entry in entries})


def makedirs(path: str) -> None:
  """os.makedirs(exist_ok=True); nothing for a URL, whose prefixes need no creating."""
  if not is_url(path):
    os.makedirs(path, exist_ok=True)


def remove(path: str) -> None:
  """Removes one file or object; FileNotFoundError when there is none."""
  if is_url(path):
    _filesystem().rm_file(path)
  else:
    os.remove(path)


def remove_tree(path: str) -> None:
  """Removes a directory and everything under it (for a URL, every object under the prefix)."""
  if is_url(path):
    _filesystem().rm(path, recursive=True)
  else:
    shutil.rmtree(path)


def rename(source: str, target: str) -> None:
  """os.replace; for URLs a copy and a delete of every object under `source` (not atomic)."""
  if is_url(source):  # Copy and delete are in every Cloud Storage API (moveTo is not).
    _filesystem().copy(source, target, recursive=True)
    _filesystem().rm(source, recursive=True)
  else:
    os.replace(source, target)


def move_aside(path: str, renamer: bool = True) -> str:
  """Renames an unreadable file or directory to `<path>.unreadable-<time>`, kept for inspection
  and out of its readers' sight; returns that name. renamer=False only names it (a run's
  processes but the first, which renames)."""
  target = f'{path}.unreadable-{time.strftime("%Y%m%d-%H%M%S")}'
  if renamer and exists(path):
    rename(path, target)
  return target


def write_text(path: str, text: str) -> None:
  """Replaces `path` with `text` whole: locally through a renamed temporary, so a kill leaves the
  old file or the new one; an object upload is whole by itself."""
  if is_url(path):
    _filesystem().pipe_file(path, text.encode('utf-8'))
    return
  def write(temporary):
    with builtins.open(temporary, 'w', encoding='utf-8') as f:
      f.write(text)
  _replace_local(path, write)


def read_text(path: str) -> str:
  with open(path, 'r', encoding='utf-8') as f:
    return f.read()


def read_json_object(path: str) -> dict:
  """The JSON object `path` holds; ValueError naming the file when it is not JSON (cut short,
  edited, not UTF-8) or not an object."""
  with open(path, 'r', encoding='utf-8') as f:
    try:
      value = json.load(f)
    except ValueError as e:
      raise ValueError(f'{path} is not JSON ({e})') from e
  if not isinstance(value, dict):
    raise ValueError(f'{path} is not a JSON object')
  return value


def upload(local_path: str, path: str) -> None:
  """Copies a local file to `path` (a URL, or another local path through a renamed temporary)."""
  if is_url(path):
    _filesystem().put_file(local_path, path)
    return
  _replace_local(path, lambda temporary: shutil.copyfile(local_path, temporary))


def _replace_local(path: str, write) -> None:
  """write(temporary) beside the local `path`, then renamed over it: a kill leaves the old file or
  the new one, and no temporary."""
  temporary = f'{path}.{os.getpid()}.tmp'
  try:
    write(temporary)
    os.replace(temporary, path)
  except BaseException:
    if os.path.exists(temporary):
      os.unlink(temporary)
    raise


def local_copy(path: str, siblings: tuple[str, ...] = ()) -> str:
  """`path` itself when local; for a URL, a copy in a new temporary directory (with the named
  sibling files that exist beside it, e.g. a BPE vocab's merges.txt), whose path is returned.
  For readers that take only local files (tokenizers, matplotlib's inputs)."""
  if not is_url(path):
    return path
  directory = tempfile.mkdtemp(prefix='bert_jax_')
  atexit.register(shutil.rmtree, directory, True)
  parent = path.rsplit('/', 1)[0]
  for name in {path.rsplit('/', 1)[-1], *siblings}:
    source = f'{parent}/{name}'
    if name == path.rsplit('/', 1)[-1] or isfile(source):
      _filesystem().get_file(source, os.path.join(directory, name))
  return os.path.join(directory, path.rsplit('/', 1)[-1])
