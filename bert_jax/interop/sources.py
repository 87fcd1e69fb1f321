"""The checkpoints a run takes settings from before it is validated: config.init_from (its shape
and vocab, init_from.py) and the teacher an objective reads (config.distill.teacher,
teacher.py). Each error is a ConfigError naming the key, as validation's are."""

from bert_jax import objectives
from bert_jax.core.errors import ConfigError
from bert_jax.interop import init_from
from bert_jax.interop import teacher


def _distills(config) -> bool:
  """Whether config.objectives names 'distill' (False where it names nothing valid: validation
  then says why)."""
  try:
    return 'objectives' in config and 'distill' in objectives.parse(config.objectives)
  except ValueError:
    return False


def adopt_teacher(config) -> None:
  """A 'distill' run adopts its teacher's shape and vocab (teacher.adopt_teacher), which the
  student is then checked against; other runs are left as they are."""
  if _distills(config):
    try:
      teacher.adopt_teacher(config)
    except teacher.InitFromError as e:
      raise ConfigError(str(e)) from e


def adopt_init_from(config) -> None:
  """With config.init_from, the source's shape and vocab are adopted (init_from.adopt_source)."""
  if config.init_from:
    try:
      init_from.adopt_source(config)
    except init_from.InitFromError as e:
      raise ConfigError(str(e)) from e


def check(config) -> None:
  """config.init_from, when set, names something that exists; a 'distill' run's student fits its
  teacher (config.distill.teacher_model): the same width, heads, feed-forward and vocab, at most
  its depth, teacher_layers within it; the teacher, when named, exists."""
  try:
    if config.init_from:
      init_from.check_exists(config.init_from)
    if _distills(config):
      teacher.check_student(config)
  except init_from.InitFromError as e:
    raise ConfigError(str(e)) from e
