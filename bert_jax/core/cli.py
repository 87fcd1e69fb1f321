"""What the `--config=FILE` commands share: absl flag parsing whose errors are one line, and a
`--help` that lists the config's keys after the flags.

  app.run(main, flags_parser=cli.flags_parser('bert_jax.main'))
"""

import difflib
import functools
import glob
import importlib.util
import os
import re
import sys
import textwrap

from absl import app
from absl import flags
from ml_collections import config_flags

from bert_jax.core import schema

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_CONFIG = 'configs/base.py'
HELP_FLAGS = ('--help', '-help', '--helpshort', '-helpshort', '-?')
_WIDTH = 100  # Help lines are wrapped at this many characters.
_KEY_COLUMN = 53  # Where a key's description starts.


# Flags that name a config file where a command defines them as one (ml_collections loads it
# when it is first read).
CONFIG_FILE_FLAGS = ('config', 'sweep')


def flags_parser(module: str):
  """absl's flags_parser for the command whose flags `module` defines."""
  return functools.partial(parse_flags, module=module)


def parse_flags(argv, module: str):
  """Parses `argv`; a bad flag, config argument or override, or a config file that does not load,
  exits with one line. --help prints the flags and then the config's keys, and exits 0."""
  if any(arg in HELP_FLAGS for arg in argv[1:]):
    try:
      print(command_help(argv, module), flush=True)
    except BrokenPipeError:  # `--help | head`
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    last_line = [line for line in str(e).splitlines() if line.strip()][-1].strip()
    sys.exit(f'Invalid flags: {last_line}\nPass --help for the flags and config keys.')
  except (AttributeError, KeyError, TypeError, ValueError) as e:
    missing = _missing_override_key(argv)
    if missing:
      sys.exit(f'Invalid config override: {missing}')
    # ml_collections wraps a KeyError's repr in an AttributeError: unwrap it to plain text.
    message = str(e).strip("'").replace('\\n', ' ').replace("\\'", "'")
    sys.exit(f'Invalid config override: {message}')
  except (OSError, ImportError, SyntaxError) as e:  # Raised by the config file's code.
    name, value = _file_argument(argv)
    _exit_config_error(value.partition(':')[0], e, 'Sweep' if name == 'sweep' else 'Config')
  for name in CONFIG_FILE_FLAGS:
    if name in flags.FLAGS and flags.FLAGS[name].present and _names_a_file(flags.FLAGS[name]):
      check_config_loads(flags.FLAGS[name])
  return rest


def _missing_override_key(argv) -> str:
  """'--NAME.a.b=V: FILE has no key a.b (a has: ...)' for the first override in argv whose key
  its config file (--NAME=FILE[:ARG]) lacks, else '': overrides set keys, they add none."""
  for name in CONFIG_FILE_FLAGS:
    spec = _config_argument(argv, name)
    if not spec:
      continue
    try:
      config = load_config_spec(spec)
    except Exception:  # pylint: disable=broad-except
      continue  # The file's own error is reported where it is loaded.
    for item in argv[1:]:
      key, sep, _ = item.partition('=')
      if not (sep and key.startswith(f'--{name}.')):
        continue
      node, path_so_far = config, []
      for part in key[len(name) + 3:].split('.'):
        if not hasattr(node, 'keys') or part not in node.keys():
          where = '.'.join(path_so_far)
          keys = sorted(node.keys()) if hasattr(node, 'keys') else []
          close = difflib.get_close_matches(part, keys, n=1)
          hint = (f'did you mean {".".join(path_so_far + close)!r}?' if close else
                  f'{where or "its top level"} has: {", ".join(keys)}' if 0 < len(keys) <= 12
                  else f'{where} has {len(keys)} keys; --{name}={spec} --help lists them'
                  if keys else f'{where} is a value, not a group')
          return (f'{item}: {spec} has no key {".".join(path_so_far + [part])!r} ({hint}); '
                  'an override sets a key the file has, it adds none.')
        node = node[part]
        path_so_far.append(part)
  return ''


def _names_a_file(flag) -> bool:
  """Whether `flag` is a config-file flag (a command's --sweep may be a plain flag, e.g. the
  benchmark's batch sizes)."""
  try:
    config_flags.get_config_filename(flag)
  except TypeError:
    return False
  return True


def check_config_loads(flag) -> None:
  """Exits naming the file when the --config file is missing or does not load; ml_collections
  would raise only where the config is first read, with a long traceback."""
  path = config_flags.get_config_filename(flag)
  if not os.path.isfile(path):
    path = path.partition(':')[0]  # The file's arguments may still be in the name.
  kind, folder = ('Sweep', 'sweeps') if flag.name == 'sweep' else ('Config', 'configs')
  if not os.path.isfile(path):
    sys.exit(f'{kind} file {path!r} does not exist (relative paths start at {os.getcwd()}); '
             f'the {folder} are {", ".join(config_files(folder))} in {os.path.join(REPO, folder)}.')
  try:
    flag.value  # pylint: disable=pointless-statement
  except (OSError, ImportError, SyntaxError) as e:
    _exit_config_error(path, e, kind)


def _exit_config_error(path: str, error: Exception, kind: str = 'Config') -> None:
  cause = error.__cause__ or error
  lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
  sys.exit(f'{kind} file {path!r} does not load: {type(cause).__name__}: '
           f'{lines[-1] if lines else ""}')


def config_files(folder: str = 'configs') -> list:
  """The config files of the repository (or its sweep files), as --config (--sweep) takes them."""
  return sorted(os.path.relpath(path, REPO) for path in glob.glob(os.path.join(REPO, folder,
                                                                              '*.py'))
                if not path.endswith('__init__.py'))


def command_help(argv, module: str) -> str:
  """The command's docstring, its flags, and the keys of --config (configs/base.py when none is
  given) with their values and comments."""
  doc = (sys.modules[module].__doc__ or '').strip()
  # absl files the flags of the program's own module under its path.
  module = sys.argv[0] if module == '__main__' else module
  lines = [doc, '', 'flags:', flags.FLAGS.module_help(module) or '  (none)', '']
  spec = _config_argument(argv) or DEFAULT_CONFIG
  path, _, arg = spec.partition(':')
  try:
    config = _load_config(path, arg or None)
  except Exception as e:  # pylint: disable=broad-except
    lines.append(f'(config keys of {spec!r} not listed: {type(e).__name__}: {e})')
  else:
    lines.append(f'config keys of {spec} (set one with --config.KEY=VALUE; '
                 f'--config=FILE --help lists another file\'s):')
    comments = {**_comments(os.path.join(REPO, 'configs', 'base.py')),
                **_comments(os.path.join(REPO, 'configs', 'finetune.py')), **_comments(path)}
    # Keys a unit declares (models/deberta/config.py): their docs, after the files' comments.
    comments.update({k: v for k, v in schema.DOCS.items() if not comments.get(k)})
    values = _flatten(config)
    order = list(dict.fromkeys([key for key in comments if key in values] + sorted(values)))
    for key, value in ((key, values[key]) for key in order):
      lines += _key_lines(f'  {key} = {value!r}', comments.get(key, ''))
  lines += [''] + textwrap.wrap(
      f'configs: {", ".join(config_files())}. A config file\'s arguments come after a colon '
      '(configs/base.py:layers=6,nsp=False; its docstring lists them); configs/base.py comments '
      'every key.', _WIDTH)
  return '\n'.join(lines)


def _key_lines(setting: str, comment: str) -> list[str]:
  """'  KEY = VALUE' and its description, whole: wrapped in a column of its own (from the next
  line when the setting is wider than its column)."""
  if not comment:
    return [setting]
  wrapped = textwrap.wrap(comment, _WIDTH - _KEY_COLUMN) or ['']
  indent = ' ' * _KEY_COLUMN
  if len(setting) >= _KEY_COLUMN:
    return [setting] + [indent + line for line in wrapped]
  return [f'{setting:<{_KEY_COLUMN - 1}} {wrapped[0]}'] + [indent + line for line in wrapped[1:]]


def _config_argument(argv, name: str = 'config'):
  """The value of --NAME in argv, or None."""
  for index, arg in enumerate(argv[1:], 1):
    if arg.startswith((f'--{name}=', f'-{name}=')):
      return arg.split('=', 1)[1]
    if arg in (f'--{name}', f'-{name}') and index + 1 < len(argv):
      return argv[index + 1]
  return None


def _file_argument(argv) -> tuple[str, str]:
  """(flag name, value) of the first config-file flag in argv; ('config', '') with none."""
  for name in CONFIG_FILE_FLAGS:
    value = _config_argument(argv, name)
    if value is not None:
      return name, value
  return 'config', ''


def load_config_file(path: str, arg=None):
  """get_config(arg) of the config file at `path` (absolute, or relative to the current
  directory, then to the repository): what --config=PATH:ARG loads."""
  return _load_config(path, arg)


def load_config_spec(spec: str):
  """get_config(ARG) of 'PATH[:ARG]', as --config=PATH:ARG loads it."""
  path, _, arg = spec.partition(':')
  return _load_config(path, arg or None)


def _load_config(path: str, arg):
  """get_config(arg) of the config file at `path` (absolute, or relative to the current
  directory, then to the repository)."""
  if not os.path.isfile(path) and os.path.isfile(os.path.join(REPO, path)):
    path = os.path.join(REPO, path)
  if REPO not in sys.path:
    sys.path.insert(0, REPO)  # Config files import `configs.base`.
  spec = importlib.util.spec_from_file_location('_config_for_help', path)
  if spec is None:
    raise FileNotFoundError(path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def _flatten(config, prefix='') -> dict:
  out = {}
  for key, value in config.items():
    if hasattr(value, 'items'):
      out.update(_flatten(value, f'{prefix}{key}.'))
    else:
      out[f'{prefix}{key}'] = value
  return out


def _comments(path: str) -> dict:
  """{'model.hidden_size': 'H.', ...}: the comment beside (or, failing that, the first sentence
  of the comment above) each `section.key = value` line of a config file."""
  if not os.path.isfile(path):
    if not os.path.isfile(os.path.join(REPO, path)):
      return {}
    path = os.path.join(REPO, path)
  with open(path, encoding='utf-8') as f:
    source = f.read().splitlines()
  aliases = {'config': ''}
  for line in source:
    match = re.match(r'\s*config\.(\w+) = (\w+) = ml_collections\.ConfigDict\(\)', line)
    if match:
      aliases[match.group(2)] = match.group(1) + '.'
  comments, above = {}, []
  for line in source:
    stripped = line.strip()
    if stripped.startswith('#'):
      above.append(stripped.lstrip('# '))
      continue
    match = re.match(r'\s*(\w+)\.(\w+) = [^=].*?(?:  # (.*))?$', line)
    key = match and match.group(1) in aliases and aliases[match.group(1)] + match.group(2)
    if key and key not in comments:  # The first assignment is get_config's.
      comments[key] = match.group(3) or re.split(r'(?<=\.) ', ' '.join(above))[0]
    above = []
  return comments


def run(main, module: str) -> None:
  """app.run(main) with this module's flag parsing."""
  app.run(main, flags_parser=flags_parser(module))
