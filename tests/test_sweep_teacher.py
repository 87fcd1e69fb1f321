"""A sweep arm that distils from another arm (`teacher`): its run reads the teacher arm's
pretraining workdir, trains after it, and is checked against the teacher's shape."""

import os

import pytest

from bert_jax.sweep import spec
from conftest import shared_data_dir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DISTILLATION = os.path.join(REPO, 'sweeps', 'distillation.py')


def distillation(order=None):
  shared_data_dir()
  sweep = spec.load_file(DISTILLATION)
  if order:
    sweep.order = order
  return sweep


def test_the_student_reads_the_teacher_arms_workdir_and_trains_after_it(tmp_path):
  plan = spec.plan(distillation(order='distilbert,bert'), str(tmp_path))
  names = [job.name for job in plan.jobs]
  student = plan.jobs[names.index('pretrain/distilbert')]
  assert student.overrides['distill.teacher'] == str(tmp_path / 'pretrain' / 'bert')
  # The report lists the student first; the teacher still trains first.
  assert 'pretrain/bert' in student.after
  assert names.index('pretrain/bert') < names.index('pretrain/distilbert')


def test_the_students_config_takes_the_teacher_arms_shape(tmp_path):
  sweep = distillation()
  config = spec.pretrain_config(sweep, sweep.arms.distilbert, 'distilbert', str(tmp_path))[2]
  assert config.distill.teacher_model.num_layers == 6
  assert config.distill.teacher_model.hidden_size == config.model.hidden_size == 768
  assert config.model.num_layers == 3
  assert config.data.vocab_file  # The teacher's vocab: the student reads its token ids.
  teacher = spec.pretrain_config(sweep, sweep.arms.bert, 'bert', str(tmp_path))[2]
  assert config.data.vocab_file == teacher.data.vocab_file


@pytest.mark.parametrize('teacher, message', [
    ('bret', "teacher='bret' names no pretrained arm that could teach it; valid are 'bert'"),
    ('distilbert', "teacher='distilbert' names no pretrained arm.*valid are 'bert'"),
])
def test_a_teacher_that_is_no_other_pretrained_arm_is_refused(tmp_path, teacher, message):
  sweep = distillation()
  sweep.arms.distilbert.teacher = teacher
  with pytest.raises(spec.SweepError, match=rf"Arm 'distilbert': {message}"):
    spec.plan(sweep, str(tmp_path))


def test_a_student_deeper_than_its_teacher_arm_is_refused_before_anything_trains(tmp_path):
  sweep = distillation()
  sweep.arms.distilbert.pretrain.model.num_layers = 8
  with pytest.raises(spec.SweepError, match=r"Arm 'distilbert'.*num_layers"):
    spec.plan(sweep, str(tmp_path))
  assert not os.listdir(tmp_path)
