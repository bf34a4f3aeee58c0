"""Tests for the `tpu-submit` program against a fake gcloud (no network).

The fake (tests/support/fake_gcloud.py) is installed as an executable `gcloud` in a
temporary bin/ that is first on PATH and named by $GCLOUD, so the real Google
Cloud CLI can never be reached. Each test reads back the recorded argv lists.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys

import pytest
import yaml
from tests.support import paths

_REPO = paths.REPO
if _REPO not in sys.path:
  # `pytest` (unlike `python -m pytest`) does not put the repository on
  # sys.path, and the editable install only maps estimator_bf16.
  sys.path.insert(0, _REPO)

# pylint: disable=g-import-not-at-top
from estimator_bf16.apps.tpu_submit import command_runner as runner_lib
from estimator_bf16.apps.tpu_submit import main as tpu_submit
from estimator_bf16.apps.tpu_submit import packaging
from estimator_bf16.apps.tpu_submit import program as program_lib
from estimator_bf16.apps.tpu_submit import validation
from estimator_bf16.precision import policy
# pylint: enable=g-import-not-at-top

PKG = 'estimator_bf16-0.1.0.tar.gz'
SSH = ['compute', 'tpus', 'tpu-vm', 'ssh']
# The smallest trainer command line: estimator_bf16.apps.train_cli requires --model.
MODEL = ['--', '--model=mnist_mlp']


class FakeGcloud:
  """Handle on the fake gcloud: its path, its call log and its answers."""

  def __init__(self, tmp_path):
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    self.path = bin_dir / 'gcloud'
    with open(os.path.join(_REPO, 'tests', 'support', 'fake_gcloud.py')) as f:
      # -IS: the fake needs only the standard library, and skipping site
      # start-up (the venv's .pth hooks) keeps each call fast.
      self.path.write_text('#!%s -IS\n%s' % (sys.executable, f.read()))
    self.path.chmod(0o755)
    self.bin_dir = bin_dir
    self.log = tmp_path / 'gcloud_calls.jsonl'
    self.responses_file = tmp_path / 'gcloud_responses.json'
    self._responses = {}

  def respond(self, prefix, exit_code=0, stdout='', stderr=''):
    self._responses[prefix] = {'exit': exit_code, 'stdout': stdout,
                               'stderr': stderr}
    self.responses_file.write_text(json.dumps(self._responses))

  def records(self):
    if not self.log.exists():
      return []
    return [json.loads(line) for line in self.log.read_text().splitlines()]

  def calls(self):
    return [r['argv'] for r in self.records()]


@pytest.fixture(name='gcloud')
def _gcloud(tmp_path, monkeypatch):
  fake = FakeGcloud(tmp_path)
  monkeypatch.setenv('FAKE_GCLOUD_LOG', str(fake.log))
  monkeypatch.setenv('FAKE_GCLOUD_RESPONSES', str(fake.responses_file))
  monkeypatch.setenv('GCLOUD', str(fake.path))
  monkeypatch.setenv('PATH', '%s%s%s' % (fake.bin_dir, os.pathsep,
                                         os.environ.get('PATH', '')))
  return fake


@pytest.fixture(name='package')
def _package(tmp_path):
  path = tmp_path / PKG
  path.write_text('a prebuilt sdist')
  return str(path)


def _set(argv, flag, value):
  """argv with `flag` set to `value` (None removes it, True adds it bare)."""
  out = [a for a in argv if a != flag and not a.startswith(flag + '=')]
  if value is True:
    out.append(flag)
  elif value is not None:
    out.append('%s=%s' % (flag, value))
  return out


def _tpu(action, **flags):
  argv = ['tpu-vm', action, '--name=bf16-v3', '--zone=us-central1-a']
  if action in ('create', 'up', 'run'):
    argv.append('--accelerator-type=v3-8')
  if action in ('create', 'up'):
    argv.append('--version=tpu-vm-tf-2.15.0-se')
  if action in ('up', 'run'):
    argv.append('--model-dir=gs://bucket/model')
  for name, value in flags.items():
    argv = _set(argv, '--' + name.replace('_', '-'), value)
  return argv


def _vertex_submit(**flags):
  argv = ['vertex', 'submit', '--region=us-central1',
          '--display-name=mnist-bf16', '--accelerator-type=TPU_V3',
          '--staging-bucket=gs://bucket/staging',
          '--model-dir=gs://bucket/model']
  for name, value in flags.items():
    argv = _set(argv, '--' + name.replace('_', '-'), value)
  return argv


def _remote(*user_args, data_dir=None):
  """The --command string expected on the TPU host."""
  train = ['python3', '-m', 'estimator_bf16.apps.train_cli', '--model_dir=gs://bucket/model']
  if data_dir:
    train.append('--data_dir=' + data_dir)
  train += ['--use_tpu', '--tpu=local', *user_args]
  return ('python3 -m pip install --quiet --user --no-deps --force-reinstall '
          '%s tf-slim==1.1.0 && %s' % (PKG, shlex.join(train)))


def _scp(package, worker='all'):
  return ['compute', 'tpus', 'tpu-vm', 'scp', package, 'bf16-v3:' + PKG,
          '--zone=us-central1-a', '--worker=' + worker]


def _ssh(*user_args, worker='all'):
  return SSH + ['bf16-v3', '--zone=us-central1-a', '--worker=' + worker,
                '--command=' + _remote(*user_args)]


CREATE = ['compute', 'tpus', 'tpu-vm', 'create', 'bf16-v3',
          '--zone=us-central1-a', '--accelerator-type=v3-8',
          '--version=tpu-vm-tf-2.15.0-se']
DELETE = ['compute', 'tpus', 'tpu-vm', 'delete', 'bf16-v3',
          '--zone=us-central1-a']


# --- Each subcommand's exact gcloud argv. ----------------------------------


def test_create_argv(gcloud):
  code = tpu_submit.main(_tpu('create', spot=True, project='my-proj'))
  assert code == 0
  assert gcloud.calls() == [CREATE + ['--spot', '--project=my-proj']]


def test_create_preemptible_and_quiet(gcloud):
  assert tpu_submit.main(_tpu('create', preemptible=True, quiet=True)) == 0
  assert gcloud.calls() == [CREATE + ['--preemptible', '--quiet']]


def test_run_copies_package_then_trains_on_all_workers(gcloud, package):
  argv = _tpu('run', package=package) + MODEL + ['--note=a b']
  assert tpu_submit.main(argv) == 0
  assert gcloud.calls() == [_scp(package),
                            _ssh('--model=mnist_mlp', '--note=a b')]


def test_run_passes_data_dir(gcloud, package):
  argv = _tpu('run', package=package, data_dir='gs://bucket/data') + MODEL
  assert tpu_submit.main(argv) == 0
  assert gcloud.calls()[1][-1] == '--command=' + _remote(
      '--model=mnist_mlp', data_dir='gs://bucket/data')


def test_user_args_reach_the_trainer_verbatim(gcloud, package):
  tricky = ['--model=mnist_mlp', '--msg=it\'s "quoted"', '--glob=*.tfrecord',
            '--x=$HOME; rm -rf /', '--empty=', '--', 'positional with spaces']
  assert tpu_submit.main(_tpu('run', package=package) + ['--'] + tricky) == 0
  command = gcloud.calls()[1][-1][len('--command='):]
  train_words = shlex.split(command.split(' && ', 1)[1])
  assert train_words[-len(tricky):] == tricky


def test_delete_argv(gcloud):
  assert tpu_submit.main(_tpu('delete')) == 0
  assert tpu_submit.main(_tpu('delete', quiet=True)) == 0
  assert gcloud.calls() == [DELETE, DELETE + ['--quiet']]


def test_up_creates_runs_then_deletes(gcloud, package):
  argv = _tpu('up', package=package) + ['--', '--model=mnist_mlp']
  assert tpu_submit.main(argv) == 0
  assert gcloud.calls() == [CREATE, _scp(package), _ssh('--model=mnist_mlp'),
                            DELETE + ['--quiet']]


def test_up_deletes_when_run_fails_and_returns_run_code(gcloud, package):
  gcloud.respond('compute tpus tpu-vm ssh', exit_code=7, stderr='OOM\n')
  assert tpu_submit.main(_tpu('up', package=package) + MODEL) == 7
  assert gcloud.calls() == [CREATE, _scp(package), _ssh('--model=mnist_mlp'),
                            DELETE + ['--quiet']]


def test_up_deletes_when_copy_fails(gcloud, package):
  gcloud.respond('compute tpus tpu-vm scp', exit_code=3)
  assert tpu_submit.main(_tpu('up', package=package) + MODEL) == 3
  assert gcloud.calls() == [CREATE, _scp(package), DELETE + ['--quiet']]


def test_up_returns_delete_code_after_good_run(gcloud, package):
  gcloud.respond('compute tpus tpu-vm delete', exit_code=5)
  assert tpu_submit.main(_tpu('up', package=package) + MODEL) == 5
  assert len(gcloud.calls()) == 4


def test_up_does_not_delete_after_failed_create(gcloud, package, capsys):
  gcloud.respond('compute tpus tpu-vm create', exit_code=1,
                 stderr='ALREADY_EXISTS\n')
  assert tpu_submit.main(_tpu('up', package=package) + MODEL) == 1
  assert gcloud.calls() == [CREATE]
  assert 'nothing was deleted' in capsys.readouterr().err


def test_up_keep_skips_delete(gcloud, package, capsys):
  assert tpu_submit.main(_tpu('up', package=package, keep=True) + MODEL) == 0
  assert gcloud.calls() == [CREATE, _scp(package), _ssh('--model=mnist_mlp')]
  assert 'compute tpus tpu-vm delete bf16-v3' in capsys.readouterr().err


def test_up_deletes_on_interrupt(gcloud, package, monkeypatch):
  real_run = runner_lib.Runner.run

  def interrupted_ssh(self, argv):
    if 'ssh' in argv:
      raise KeyboardInterrupt
    return real_run(self, argv)

  monkeypatch.setattr(runner_lib.Runner, 'run', interrupted_ssh)
  assert tpu_submit.main(_tpu('up', package=package) + MODEL) == 130
  assert gcloud.calls() == [CREATE, _scp(package), DELETE + ['--quiet']]


def test_pod_slice_runs_on_every_worker(gcloud, package, capsys):
  argv = _tpu('up', package=package, accelerator_type='v3-32',
              version='tpu-vm-tf-2.15.0-pod-se') + MODEL + ['--num_shards',
                                                           '32']
  assert tpu_submit.main(argv) == 0
  calls = gcloud.calls()
  assert calls[0][5:7] == ['--zone=us-central1-a', '--accelerator-type=v3-32']
  assert '--worker=all' in calls[1] and '--worker=all' in calls[2]
  assert 'pod slice of 4 hosts' in capsys.readouterr().err


def test_vertex_submit_uploads_and_creates_job(gcloud, package, tmp_path):
  work = tmp_path / 'work'
  argv = _vertex_submit(package=package, work_dir=str(work), timeout='2h',
                        spot=True) + ['--', '--model=mnist_mlp']
  assert tpu_submit.main(argv) == 0
  staged = 'gs://bucket/staging/tpu_submit/mnist-bf16/' + PKG
  config = str(work / 'mnist-bf16.yaml')
  assert gcloud.calls() == [
      ['storage', 'cp', package, staged],
      ['ai', 'custom-jobs', 'create', '--region=us-central1',
       '--display-name=mnist-bf16', '--config=' + config]]
  with open(config) as f:
    spec = yaml.safe_load(f)
  (pool,) = spec['workerPoolSpecs']
  assert pool['machineSpec'] == {'machineType': 'cloud-tpu',
                                 'acceleratorType': 'TPU_V3',
                                 'acceleratorCount': 8}
  assert pool['replicaCount'] == 1
  assert pool['pythonPackageSpec'] == {
      'executorImageUri':
          'us-docker.pkg.dev/vertex-ai/training/tf-tpu.2-15.cp310:latest',
      'packageUris': [staged],
      'pythonModule': 'estimator_bf16.apps.train_cli',
      'args': ['--model_dir=gs://bucket/model', '--use_tpu', '--tpu=local',
               '--model=mnist_mlp']}
  assert spec['scheduling'] == {'timeout': '7200s', 'strategy': 'SPOT'}


def test_vertex_container_image_skips_upload(gcloud, tmp_path):
  work = tmp_path / 'work'
  argv = _vertex_submit(container_image='europe-docker.pkg.dev/p/r/trainer:1',
                        staging_bucket=None, work_dir=str(work),
                        accelerator_type='TPU_V2', region='europe-west4',
                        data_dir='gs://bucket/data')
  assert tpu_submit.main(argv + MODEL) == 0
  (create,) = gcloud.calls()
  assert create[:3] == ['ai', 'custom-jobs', 'create']
  spec = yaml.safe_load((work / 'mnist-bf16.yaml').read_text())
  pool = spec['workerPoolSpecs'][0]
  assert pool['machineSpec']['acceleratorType'] == 'TPU_V2'
  assert pool['containerSpec'] == {
      'imageUri': 'europe-docker.pkg.dev/p/r/trainer:1',
      'command': ['python3', '-m', 'estimator_bf16.apps.train_cli'],
      'args': ['--model_dir=gs://bucket/model', '--data_dir=gs://bucket/data',
               '--use_tpu', '--tpu=local', '--model=mnist_mlp']}
  assert 'scheduling' not in spec


def test_vertex_executor_image_follows_region(gcloud, package, tmp_path):
  argv = _vertex_submit(package=package, work_dir=str(tmp_path),
                        region='europe-west4')
  assert tpu_submit.main(argv + MODEL) == 0
  spec = yaml.safe_load((tmp_path / 'mnist-bf16.yaml').read_text())
  image = spec['workerPoolSpecs'][0]['pythonPackageSpec']['executorImageUri']
  assert image.startswith('europe-docker.pkg.dev/vertex-ai/training/')


@pytest.mark.parametrize('action, verb', [
    ('status', 'describe'), ('logs', 'stream-logs'), ('cancel', 'cancel')])
def test_vertex_job_commands(gcloud, action, verb):
  argv = ['vertex', action, '1234567890', '--region=us-central1',
          '--project=my-proj']
  assert tpu_submit.main(argv) == 0
  assert gcloud.calls() == [['ai', 'custom-jobs', verb, '1234567890',
                             '--region=us-central1', '--project=my-proj']]


def test_vertex_status_accepts_full_resource_name(gcloud):
  job = 'projects/p/locations/us-central1/customJobs/42'
  assert tpu_submit.main(['vertex', 'status', job,
                          '--region=us-central1']) == 0
  assert gcloud.calls()[0][3] == job


def test_vertex_list(gcloud):
  assert tpu_submit.main(['vertex', 'list', '--region=us-central1']) == 0
  assert gcloud.calls() == [['ai', 'custom-jobs', 'list',
                             '--region=us-central1']]


def test_gcloud_output_is_streamed_and_exit_code_propagated(gcloud, capfd):
  gcloud.respond('ai custom-jobs describe', exit_code=4,
                 stdout='state: JOB_STATE_FAILED\n')
  code = tpu_submit.main(['vertex', 'status', '42', '--region=us-central1'])
  assert code == 4
  assert 'state: JOB_STATE_FAILED' in capfd.readouterr().out


# --- Where gcloud comes from. ----------------------------------------------


def test_gcloud_found_on_path(gcloud, monkeypatch):
  monkeypatch.delenv('GCLOUD')
  assert tpu_submit.main(_tpu('delete')) == 0
  assert gcloud.calls() == [DELETE]


def test_gcloud_flag_wins_over_env(gcloud, monkeypatch):
  monkeypatch.setenv('GCLOUD', '/nonexistent/gcloud')
  assert tpu_submit.main(_tpu('delete', gcloud=str(gcloud.path))) == 0
  assert gcloud.calls() == [DELETE]


def test_commands_run_from_the_repository(gcloud):
  assert tpu_submit.main(_tpu('delete')) == 0
  assert gcloud.records()[0]['cwd'] == _REPO


# --- Packaging. --------------------------------------------------------------


def _fake_python(tmp_path, monkeypatch, produce=True):
  """A stand-in interpreter for `python setup.py sdist`; logs its argv."""
  script = tmp_path / 'fake_python'
  log = tmp_path / 'python_calls.json'
  script.write_text(
      '#!%s -IS\nimport json, os, sys\n'
      'args = sys.argv[1:]\n'
      'open(%r, "w").write(json.dumps({"argv": args, "cwd": os.getcwd()}))\n'
      'dist = args[args.index("--dist-dir") + 1]\n'
      'os.makedirs(dist, exist_ok=True)\n'
      'if %r:\n'
      '  open(os.path.join(dist, %r), "w").write("sdist")\n'
      % (sys.executable, str(log), produce, PKG))
  script.chmod(0o755)
  monkeypatch.setattr(sys, 'executable', str(script))
  return log


def test_up_builds_the_sdist_before_creating(gcloud, tmp_path, monkeypatch):
  log = _fake_python(tmp_path, monkeypatch)
  work = tmp_path / 'work'
  assert tpu_submit.main(_tpu('up', work_dir=str(work)) + MODEL) == 0
  build = json.loads(log.read_text())
  dist = str(work / 'dist')
  assert build == {'argv': ['setup.py', '--quiet', 'sdist', '--dist-dir', dist],
                   'cwd': _REPO}
  calls = gcloud.calls()
  assert calls[0] == CREATE
  assert calls[1] == _scp(os.path.join(dist, PKG))


def test_failed_build_creates_nothing(gcloud, tmp_path, monkeypatch, capsys):
  _fake_python(tmp_path, monkeypatch, produce=False)
  assert tpu_submit.main(_tpu('up', work_dir=str(tmp_path / 'w')) + MODEL) == 1
  assert gcloud.calls() == []
  assert 'did not produce' in capsys.readouterr().err


def test_package_name_comes_from_setup_py():
  plan = packaging.plan(None, 'out', packaging.repo_root())
  assert plan.file_name == PKG
  assert plan.local_path == os.path.join('out', 'dist', PKG)


# --- Dry run. ----------------------------------------------------------------


def test_dry_run_prints_every_command_and_runs_nothing(gcloud, capsys):
  argv = _tpu('up', dry_run=True, data_dir='gs://bucket/data') + [
      '--', '--model=mnist_mlp']
  assert tpu_submit.main(argv) == 0
  assert gcloud.calls() == []
  lines = capsys.readouterr().out.splitlines()
  commands = [shlex.split(line) for line in lines]
  dist = os.path.join('build', 'tpu_submit', 'dist')
  assert commands[0][1:] == ['setup.py', '--quiet', 'sdist', '--dist-dir',
                             dist]
  assert [c[0] for c in commands[1:]] == [str(gcloud.path)] * 4
  assert commands[1][1:] == CREATE
  assert commands[2][1:] == _scp(os.path.join(dist, PKG))
  assert commands[3][1:-1] == _ssh()[:-1]
  assert commands[3][-1] == '--command=' + _remote(
      '--model=mnist_mlp', data_dir='gs://bucket/data')
  assert commands[4][1:] == DELETE + ['--quiet']


def test_dry_run_needs_no_gcloud(gcloud, capsys):
  argv = _tpu('delete', dry_run=True, gcloud='/nonexistent/gcloud')
  assert tpu_submit.main(argv) == 0
  assert capsys.readouterr().out.startswith('/nonexistent/gcloud compute')
  assert gcloud.calls() == []


def test_vertex_dry_run_prints_commands_then_yaml(gcloud, capsys, tmp_path):
  argv = _vertex_submit(dry_run=True, work_dir=str(tmp_path)) + MODEL
  assert tpu_submit.main(argv) == 0
  assert gcloud.calls() == []
  out = capsys.readouterr().out
  commands, config = out.split('# %s:\n' % (tmp_path / 'mnist-bf16.yaml'))
  assert [shlex.split(c)[1:3] for c in commands.splitlines()] == [
      ['setup.py', '--quiet'], ['storage', 'cp'], ['ai', 'custom-jobs']]
  spec = yaml.safe_load(config)
  assert spec['workerPoolSpecs'][0]['machineSpec']['acceleratorCount'] == 8
  assert not (tmp_path / 'mnist-bf16.yaml').exists()


def test_ai_platform_dry_run_prints_legacy_command(gcloud, package, capsys):
  argv = ['ai-platform', 'submit', '--job-name=mnist_bf16',
          '--region=us-central1', '--staging-bucket=gs://bucket',
          '--model-dir=gs://bucket/model', '--package=' + package,
          '--project=p', '--dry-run', '--', '--model=mnist_mlp']
  assert tpu_submit.main(argv) == 0
  assert gcloud.calls() == []
  captured = capsys.readouterr()
  submit = shlex.split(captured.out.splitlines()[-1])[1:]
  assert submit[:5] == ['ai-platform', 'jobs', 'submit', 'training',
                        'mnist_bf16']
  assert '--scale-tier=BASIC_TPU' in submit
  assert submit[submit.index('--'):] == [
      '--', '--model_dir=gs://bucket/model', '--use_tpu', '--model=mnist_mlp']
  assert submit[submit.index('--') - 1] == '--project=p'
  assert 'shut down in January 2025' in captured.err
  assert 'tpu-vm up' in captured.err and 'vertex submit' in captured.err


# --- A program of one's own, through `estimator_bf16 run`. --------------------


@pytest.fixture(name='program')
def _program(tmp_path):
  """A user's program folder: the program and a sibling module."""
  folder = tmp_path / 'mnist'
  folder.mkdir()
  (folder / 'mnist_tpu.py').write_text('import helper\n')
  (folder / 'helper.py').write_text('')
  return folder / 'mnist_tpu.py'


def _program_remote(*program_args, precision='bfloat16', levers=()):
  run = ['python3', '-m', 'estimator_bf16', 'run', '--precision=' + precision,
         *levers, 'mnist/mnist_tpu.py', *program_args]
  return ('python3 -m pip install --quiet --user --no-deps --force-reinstall '
          '%s tf-slim==1.1.0 && %s' % (PKG, shlex.join(run)))


def _program_scp(program):
  return ['compute', 'tpus', 'tpu-vm', 'scp', '--recurse',
          str(program.parent), 'bf16-v3:', '--zone=us-central1-a',
          '--worker=all']


PROGRAM_ARGS = ['--tpu=local', '--use_tpu', '--model_dir=gs://bucket/m']


def test_run_program_copies_its_folder_then_runs_it_in_bfloat16(
    gcloud, package, program):
  argv = _tpu('run', package=package, model_dir=None, program=str(program))
  assert tpu_submit.main(argv + ['--'] + PROGRAM_ARGS) == 0
  assert gcloud.calls() == [
      _scp(package), _program_scp(program),
      SSH + ['bf16-v3', '--zone=us-central1-a', '--worker=all',
             '--command=' + _program_remote(*PROGRAM_ARGS)]]


def test_up_program_in_float32_then_deletes(gcloud, package, program):
  argv = _tpu('up', package=package, model_dir=None, program=str(program),
              precision='float32')
  assert tpu_submit.main(argv + ['--'] + PROGRAM_ARGS) == 0
  calls = gcloud.calls()
  assert calls[0] == CREATE and calls[-1] == DELETE + ['--quiet']
  assert calls[2] == _program_scp(program)
  assert calls[3][-1] == '--command=' + _program_remote(
      *PROGRAM_ARGS, precision='float32')


def test_run_program_passes_the_fit_levers_on(gcloud, package, program):
  # The row `check --fit --device=tpu-v3` chose: K=4 and recompute.
  argv = _tpu('run', package=package, model_dir=None, program=str(program),
              accumulate='4') + ['--recompute']
  assert tpu_submit.main(argv + ['--'] + PROGRAM_ARGS) == 0
  assert gcloud.calls()[-1][-1] == '--command=' + _program_remote(
      *PROGRAM_ARGS, levers=('--accumulate=4', '--recompute'))


def test_program_dry_run_prints_and_runs_nothing(gcloud, package, program,
                                                 capsys):
  argv = _tpu('run', package=package, model_dir=None, program=str(program),
              dry_run=True)
  assert tpu_submit.main(argv + ['--', '--model_dir=gs://bucket/m']) == 0
  assert gcloud.calls() == []
  captured = capsys.readouterr()
  commands = [shlex.split(line) for line in captured.out.splitlines()]
  assert [c[1:] for c in commands[:2]] == [_scp(package),
                                           _program_scp(program)]
  assert commands[2][-1] == '--command=' + _program_remote(
      '--model_dir=gs://bucket/m')
  # No --tpu among the program's arguments: the user hears how to add it.
  assert 'add --tpu=local after --' in captured.err


@pytest.mark.parametrize('change, message', [
    (dict(program='{folder}/missing.py'), 'missing.py: no such file'),
    (dict(program='{folder}/helper.txt'), 'give the Python program'),
    (dict(model_dir='gs://bucket/m'),
     '--model-dir is a flag of estimator_bf16.apps.train_cli; with --program'),
    (dict(precision='float16'), "--precision must be one of 'float32', "
     "'bfloat16', got 'float16'"),
    (dict(program=None, precision='float32'), '--precision goes with '
     '--program'),
    (dict(program=None, accumulate='4'), '--accumulate goes with '
     '--program'),
    (dict(accumulate='0'), '--accumulate=0: K is the number of'),
    (dict(args=['--model_dir=/home/me/model']),
     '--model_dir=/home/me/model after --: the TPU host cannot read'),
    (dict(args=['--use_tpu=false']), 'runs on a TPU VM to use its TPU'),
    (dict(big=True), 'holds more than 50 MiB'),
], ids=['missing', 'not-python', 'model-dir', 'precision', 'precision-alone',
        'accumulate-alone', 'accumulate-zero', 'local-dir', 'no-tpu',
        'big-folder'])
def test_program_validation_exits_2_without_gcloud(gcloud, package, program,
                                                   capsys, change, message):
  flags = dict(package=package, model_dir=None, program=str(program))
  for key in ('program', 'model_dir', 'precision', 'accumulate'):
    if key in change:
      value = change[key]
      flags[key] = (value.format(folder=program.parent)
                    if isinstance(value, str) else value)
  if change.get('big'):
    with open(program.parent / 'data.bin', 'wb') as f:
      f.truncate(51 * 2**20)  # Sparse: costs no disk.
  argv = _tpu('run', **flags) + ['--'] + change.get('args', PROGRAM_ARGS)
  assert tpu_submit.main(argv) == 2
  assert message in capsys.readouterr().err
  assert gcloud.calls() == []


@pytest.mark.parametrize('given, planned', [
    (None, 'bfloat16'), ('float32', 'float32'), ('bfloat16', 'bfloat16')])
def test_program_plan_parses_the_precision_once(program, given, planned):
  args = argparse.Namespace(
      program=str(program), precision=given, accumulate=None, recompute=None,
      model_dir=None, data_dir=None, trainer_args=['--tpu=local'])
  planned_program = program_lib.plan(args)
  assert isinstance(planned_program.precision, policy.Precision)
  assert planned_program.precision == planned
  assert '--precision=' + planned in program_lib.run_words(planned_program, [])


def test_bad_precision_lists_both_choices(program):
  args = argparse.Namespace(
      program=str(program), precision='fp32', accumulate=None, recompute=None,
      model_dir=None, data_dir=None, trainer_args=['--tpu=local'])
  with pytest.raises(validation.UsageError,
                     match="--precision must be one of 'float32', 'bfloat16'"):
    program_lib.plan(args)


def test_ai_platform_says_shut_down_before_any_missing_flag(gcloud, capsys):
  assert tpu_submit.main(['ai-platform', 'submit', '--', '--model=m']) == 2
  err = capsys.readouterr().err
  assert 'AI Platform Training was shut down' in err
  assert '--job-name' not in err
  # With --dry-run the missing flags are named, after the shutdown.
  assert tpu_submit.main(['ai-platform', 'submit', '--dry-run', '--',
                          '--model=m']) == 2
  err = capsys.readouterr().err
  assert err.index('shut down') < err.index(
      'required: --job-name, --region, --staging-bucket, --model-dir')
  assert gcloud.calls() == []


# --- TPU v2 -> v3. -----------------------------------------------------------


@pytest.mark.parametrize('argv, says_so', [
    (_tpu('create', dry_run=True), True),
    (_tpu('create', dry_run=True, accelerator_type='v2-8'), False),
    (_vertex_submit(dry_run=True, container_image='i') + MODEL, True),
    (_vertex_submit(dry_run=True, container_image='i',
                    accelerator_type='TPU_V2') + MODEL, False),
], ids=['tpu-vm-v3', 'tpu-vm-v2', 'vertex-v3', 'vertex-v2'])
def test_v3_needs_no_code_change(gcloud, capsys, argv, says_so):
  assert tpu_submit.main(argv) == 0
  err = capsys.readouterr().err
  assert ('no code change' in err) == says_so
  assert ('8 shards per host' in err) == says_so


# --- Validation: exit 2, a clear message, and no gcloud call. ----------------

_POD = dict(accelerator_type='v3-32', version='tpu-vm-tf-2.15.0-pod-se')

VALIDATION_CASES = {
    'model-dir-local': (
        _tpu('up', model_dir='runs/mnist'),
        '--model-dir=runs/mnist must be a gs:// path'),
    'data-dir-local': (
        _tpu('run', data_dir='/data/mnist'),
        '--data-dir=/data/mnist must be a gs:// path'),
    'vertex-model-dir-local': (
        _vertex_submit(model_dir='/tmp/model'),
        '--model-dir=/tmp/model must be a gs:// path'),
    'staging-bucket-local': (
        _vertex_submit(staging_bucket='staging'),
        '--staging-bucket=staging must be a gs:// path'),
    'bucket-name': (
        _tpu('up', model_dir='gs://B/model'),
        '--model-dir=gs://B/model: "B" is not a valid bucket name'),
    'staging-bucket-missing': (
        _vertex_submit(staging_bucket=None),
        '--staging-bucket is required'),
    'tpu-name': (
        _tpu('create', name='My_TPU'),
        '--name=My_TPU: a TPU name is 1-63 lowercase letters'),
    'display-name': (
        _vertex_submit(display_name='my job'),
        '--display-name=my job: use 1-128 letters'),
    'ai-platform-job-name': (
        ['ai-platform', 'submit', '--job-name=1-job', '--region=us-central1',
         '--staging-bucket=gs://b', '--model-dir=gs://b/m', '--dry-run'],
        '--job-name=1-job: AI Platform job names'),
    'tpu-vm-accelerator-vertex-spelling': (
        _tpu('create', accelerator_type='TPU_V3'),
        'TPU_V3 is the Vertex AI spelling; a TPU VM wants e.g. v3-8'),
    'tpu-vm-accelerator-generation': (
        _tpu('create', accelerator_type='v9-8'),
        '--accelerator-type=v9-8 is not a TPU VM type'),
    'tpu-vm-accelerator-cores': (
        _tpu('create', accelerator_type='v3-12'),
        'the core count must be a multiple of 8'),
    'vertex-accelerator': (
        _vertex_submit(accelerator_type='v3-8'),
        '--accelerator-type=v3-8 is not a Vertex AI TPU type; use one of '
        'TPU_V2, TPU_V3'),
    'zone-outside-region': (
        _tpu('create', zone='europe-west4-a', region='us-central1'),
        '--zone=europe-west4-a is not inside --region=us-central1'),
    'zone-format': (
        _tpu('delete', zone='us-central1'),
        '--zone=us-central1 is not a zone'),
    'region-format': (
        _vertex_submit(region='us-central1-a'),
        '--region=us-central1-a is not a region'),
    'runtime-without-estimator': (
        _tpu('create', version='tpu-vm-tf-2.16.1-pjrt'),
        'tf.estimator (and so TPUEstimator) was removed in TensorFlow 2.16'),
    'runtime-too-old': (
        _tpu('up', version='tpu-vm-tf-2.14.0-se'),
        'estimator_bf16 needs TensorFlow 2.15'),
    'runtime-spelling': (
        _tpu('create', version='2.15.0'),
        '--version=2.15.0 is not a TPU VM TensorFlow runtime'),
    'pod-slice-needs-pod-runtime': (
        _tpu('create', accelerator_type='v3-32'),
        'a multi-host slice needs the -pod runtime, e.g. '
        'tpu-vm-tf-2.15.0-pod-se'),
    'single-host-pod-runtime': (
        _tpu('create', version='tpu-vm-tf-2.15.0-pod-pjrt'),
        'a single-host TPU takes the runtime without -pod, e.g. '
        'tpu-vm-tf-2.15.0-pjrt'),
    'pod-slice-worker': (
        _tpu('up', worker='0', **_POD),
        '--worker=0 on v3-32: a pod slice runs the trainer on every host; '
        'use --worker=all'),
    'pod-slice-worker-run': (
        _tpu('run', worker='1', accelerator_type='v2-32'),
        '--worker=1 on v2-32'),
    'trainer-args-without-separator': (
        _tpu('up') + ['--model=mnist_mlp'],
        'unrecognized arguments: --model=mnist_mlp. Trainer arguments go after '
        '`--`'),
    'trainer-sets-model-dir': (
        _tpu('up') + MODEL + ['--model_dir=gs://bucket/other'],
        'trainer argument --model_dir=gs://bucket/other after --: pass '
        '--model-dir=gs://... to tpu_submit instead'),
    'trainer-sets-use-tpu': (
        _vertex_submit() + MODEL + ['--nouse_tpu'],
        'a TPU job always runs with --use_tpu'),
    'trainer-needs-model': (
        _tpu('up') + ['--', '--precision=bfloat16'],
        'no --model among the trainer arguments: estimator_bf16.apps.train_cli needs one'),
    'trainer-needs-args': (
        _tpu('run'),
        'no --model among the trainer arguments'),
    'num-shards-v3-8': (
        _tpu('up') + MODEL + ['--num_shards=16'],
        '--num_shards=16 after -- does not match the 8 cores of v3-8: '
        'TPUEstimator runs one shard per core, 8 per host on TPU v2 and v3'),
    'num-shards-vertex': (
        _vertex_submit() + MODEL + ['--num_shards', '32'],
        '--num_shards=32 after -- does not match the 8 cores of v3-8'),
    'num-shards-pod-slice': (
        _tpu('up', **_POD) + MODEL,
        'v3-32 has 32 cores but estimator_bf16.apps.train_cli defaults to 8 shards (one host); '
        'add --num_shards=32 after --'),
    'trainer-args-on-delete': (
        _tpu('delete') + ['--', '--model=mnist_mlp'],
        '`tpu-vm delete` takes no trainer arguments after --'),
    'timeout-format': (
        _vertex_submit(timeout='soon'),
        '--timeout=soon: use a duration such as 2h'),
    'timeout-zero': (
        _vertex_submit(timeout='0h'),
        '--timeout=0h must be longer than zero'),
    'job-id-format': (
        ['vertex', 'logs', 'my-job', '--region=us-central1'],
        'JOB_ID=my-job: pass the numeric job ID'),
    'job-id-region': (
        ['vertex', 'cancel', 'projects/p/locations/europe-west4/customJobs/1',
         '--region=us-central1'],
        'lives in europe-west4 but --region=us-central1'),
    'container-and-package': (
        _vertex_submit(container_image='img', package='x.tar.gz'),
        '--container-image replaces the package'),
    'package-missing': (
        _tpu('up', package='no/such/pkg.tar.gz') + MODEL,
        '--package=no/such/pkg.tar.gz does not exist'),
    'gcloud-missing': (
        _tpu('create', gcloud='/nonexistent/gcloud'),
        '--gcloud=/nonexistent/gcloud: no such executable'),
    'required-flag': (
        _tpu('up', model_dir=None),
        'the following arguments are required: --model-dir'),
    'spot-and-preemptible': (
        _tpu('create', spot=True, preemptible=True),
        'argument --preemptible: not allowed with argument --spot'),
    'ai-platform-shut-down': (
        ['ai-platform', 'submit', '--job-name=j', '--region=us-central1',
         '--staging-bucket=gs://b', '--model-dir=gs://b/m'],
        'AI Platform Training was shut down in January 2025'),
}


@pytest.mark.parametrize('argv, message', list(VALIDATION_CASES.values()),
                         ids=list(VALIDATION_CASES))
def test_validation_errors_exit_2_without_gcloud(gcloud, capsys, argv,
                                                 message):
  assert tpu_submit.main(argv) == 2
  assert message in capsys.readouterr().err
  assert gcloud.calls() == []
  assert not gcloud.log.exists()


@pytest.mark.parametrize('trainer_args', [
    ['--model', 'mnist_mlp'],
    ['--flagfile=gs://bucket/flags.txt'],
    ['--model=mnist_mlp', '--num_shards=8'],
    ['--model=mnist_mlp', '--', '--model_dir=not-a-flag-any-more'],
], ids=['model-separate', 'flagfile', 'num-shards-8', 'after-second-dashes'])
def test_accepted_trainer_args(gcloud, package, trainer_args):
  argv = _tpu('run', package=package) + ['--'] + trainer_args
  assert tpu_submit.main(argv) == 0
  assert gcloud.calls()[1][-1].endswith(shlex.join(trainer_args))


# --- As a program. -----------------------------------------------------------


def test_help_lists_the_flags_and_exits_0(capsys):
  # In-process: the module run below covers `python -m` itself.
  assert tpu_submit.main(['tpu-vm', 'up', '--help']) == 0
  out = capsys.readouterr().out
  assert '--accelerator-type' in out
  assert 'Trainer arguments go after `--`' in out


@pytest.mark.slow
def test_usage_error_exits_2_as_a_module():
  # One process (a TensorFlow import): `python -m` runs main and exits with
  # its status, here argparse's usage error.
  result = subprocess.run(
      [sys.executable, '-m', 'estimator_bf16.apps.tpu_submit', 'tpu-vm', 'up',
       '--name=x'], capture_output=True, text=True, cwd=_REPO, check=False)
  assert result.returncode == 2, (result.returncode, result.stderr)
  assert 'error: the following arguments are required: --zone' in (
      result.stderr)
