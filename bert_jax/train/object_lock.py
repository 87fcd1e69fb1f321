"""One run per workdir where the workdir is in Cloud Storage, which has no flock.

The lock is an object (WORKDIR/.lock) written only if no object of that name exists (Cloud
Storage's generation precondition: of two runs creating it at once, exactly one succeeds). It
names its holder (process, host, start) and when the holder last renewed it; the holder renews it
every `renew_s` seconds from a daemon thread, each write conditional on the object still being
the one it wrote. Nothing releases the lock of a killed process, so another run takes it over

- at once when the holder ran on this host and its process is gone (what flock's release by the
  kernel gives a local workdir: a killed run is resumed by rerunning the command), or
- once the holder has not renewed it for `stale_s` seconds (a lost VM, a run killed elsewhere);

and otherwise is refused, naming the holder. A takeover is conditional on the generation read,
so of two runs taking over one lock, one wins. The ages compare clocks of two hosts: they are
assumed to agree to well under `stale_s` (NTP on cloud VMs). A clean end deletes the object.
"""

import json
import os
import socket
import threading
import time
from typing import Callable

from absl import logging

RENEW_S = 60.0  # How often the holder rewrites the lock.
STALE_S = 300.0  # A lock not renewed for this long is a dead run's, taken over.


class LockHeldError(RuntimeError):
  """Another live run holds the lock."""

  def __init__(self, holder: dict, age_s: float | None):
    super().__init__(f'held by {holder}')
    self.holder = holder
    self.age_s = age_s  # Seconds since the holder last renewed it; None when unreadable.


def _blob(url: str):
  """The google.cloud.storage Blob of gs://BUCKET/NAME (STORAGE_EMULATOR_HOST is honoured)."""
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  bucket, _, name = url[len('gs://'):].partition('/')
  return storage.Client().bucket(bucket).blob(name)


def _holder_record(started: str) -> bytes:
  return json.dumps({'pid': os.getpid(), 'host': socket.gethostname(), 'started': started,
                     'renewed': time.time()}).encode()


class ObjectLock:
  """The lock object at `url` (gs://...), held by this process between acquire and release."""

  def __init__(self, url: str, renew_s: float = RENEW_S, stale_s: float = STALE_S):
    self.url = url
    self.renew_s, self.stale_s = renew_s, stale_s
    self._blob = _blob(url)
    self._generation = None  # Of the object this process wrote last.
    self._started = time.strftime('%Y-%m-%d %H:%M:%S')
    self._stop = threading.Event()
    self._renewer = None

  def acquire(self, holder_gone: Callable[[dict], bool]) -> dict | None:
    """Takes the lock; returns the record of a dead holder it took over (None when it was free).
    LockHeldError when a live run holds it; holder_gone(record) says whether its process is known
    to have ended."""
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    try:
      self._write(if_generation_match=0)
      previous = None
    except exceptions.PreconditionFailed:
      previous, generation = self._read()
      age = time.time() - previous['renewed'] if 'renewed' in previous else None
      if not (holder_gone(previous) or (age is not None and age > self.stale_s)):
        raise LockHeldError(previous, age)  # pylint: disable=raise-missing-from
      try:
        self._write(if_generation_match=generation)
      except exceptions.PreconditionFailed:  # Another run took it over first.
        holder, _ = self._read()
        raise LockHeldError(holder, 0.0)  # pylint: disable=raise-missing-from
    self._renewer = threading.Thread(target=self._renew, name='workdir-lock', daemon=True)
    self._renewer.start()
    return previous

  def _write(self, if_generation_match: int) -> None:
    self._blob.upload_from_string(_holder_record(self._started), content_type='application/json',
                                  if_generation_match=if_generation_match)
    self._generation = self._blob.generation

  def _read(self) -> tuple[dict, int]:
    """(holder record, generation) of the lock object as it is now; {} for an unreadable one."""
    self._blob.reload()
    generation = self._blob.generation
    try:
      record = json.loads(self._blob.download_as_bytes(if_generation_match=generation))
    except ValueError:
      record = {}
    return (record if isinstance(record, dict) else {}), generation

  def _renew(self) -> None:
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    while not self._stop.wait(self.renew_s):
      try:
        self._write(if_generation_match=self._generation)
      except exceptions.PreconditionFailed:
        logging.error('The workdir lock %s was taken over by another run (this run did not renew '
                      'it for %.0f s); two runs may now write this workdir.', self.url,
                      self.stale_s)
        return
      except Exception as e:  # pylint: disable=broad-except
        logging.warning('Could not renew the workdir lock %s (%s); retrying in %.0f s.', self.url,
                        e, self.renew_s)

  def release(self) -> None:
    """Stops renewing and deletes the object, if it is still the one this process wrote."""
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    self._stop.set()
    if self._renewer is not None:
      self._renewer.join()
    if self._generation is not None:
      try:
        self._blob.delete(if_generation_match=self._generation)
      except (exceptions.NotFound, exceptions.PreconditionFailed):
        pass
      self._generation = None
