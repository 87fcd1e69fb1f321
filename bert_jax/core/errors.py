"""The errors every layer raises about a run's settings, and what keeps a command's error its
last line."""

import sys


class ConfigError(ValueError):
  """A config value that cannot work."""


def quiet_closed_loop_echoes() -> None:
  """For the rest of this process, drops the 'RuntimeError: Event loop is closed' that
  tensorstore's callbacks of an abandoned orbax read or write print when they fire after the
  read's own quieting ended (at exit, say): the command has reported that failure in one line,
  and without this its stderr could end with the echo instead. Only that error, raised by
  asyncio itself and unraisable, is dropped. Commands call it at their start."""
  previous = sys.unraisablehook
  if getattr(previous, 'drops_closed_loop_echoes', False):
    return

  def hook(unraisable):
    error, tb = unraisable.exc_value, unraisable.exc_traceback
    while tb is not None and tb.tb_next is not None:
      tb = tb.tb_next
    raised_by_asyncio = tb is not None and '/asyncio/' in tb.tb_frame.f_code.co_filename.replace(
        '\\', '/')
    if not (isinstance(error, RuntimeError) and str(error) == 'Event loop is closed'
            and raised_by_asyncio):
      previous(unraisable)
  hook.drops_closed_loop_echoes = True
  sys.unraisablehook = hook
