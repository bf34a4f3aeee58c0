"""TF_CONFIG, read and checked the way Estimator users write it.

A multi-worker job describes itself in the `TF_CONFIG` environment variable:

    {"cluster": {"chief": ["host0:port"], "worker": ["host1:port", ...],
                 "evaluator": ["host2:port"]},
     "task": {"type": "worker", "index": 0}}

`read_tf_config()` parses and checks it before any graph is built, so that a
typo fails with a sentence naming the fault instead of a hang in the first
collective op: a missing chief, an address listed twice, a task that is not
in the cluster, parameter servers (this package trains with all-reduce, not
with parameter servers).
"""

import collections
import json
import os

# Tasks that train (all-reduce peers) and the one that only evaluates.
TRAINING_TASKS = ('chief', 'worker')
EVALUATOR = 'evaluator'
_KNOWN_TASKS = TRAINING_TASKS + (EVALUATOR,)


class ClusterError(ValueError):
  """TF_CONFIG describes no usable cluster; the message says what to fix."""


class Cluster(collections.namedtuple(
    'Cluster', ['jobs', 'task_type', 'task_index'])):
  """One task's view of a checked TF_CONFIG.

  Attributes:
    jobs: dict {job name: list of 'host:port'} for 'chief', 'worker' and
      'evaluator' (jobs that are absent are left out).
    task_type: 'chief', 'worker' or 'evaluator'.
    task_index: int, this task's position in its job.
  """

  @property
  def training_jobs(self):
    """{job: addresses} of the all-reduce peers (chief and workers)."""
    return {job: addresses for job, addresses in self.jobs.items()
            if job in TRAINING_TASKS}

  @property
  def num_workers(self):
    """Training processes: the chief plus the workers."""
    return sum(len(addresses) for addresses in self.training_jobs.values())

  @property
  def worker_index(self):
    """0 for the chief, 1 + index for a worker; None for the evaluator."""
    if self.task_type == 'chief':
      return 0
    if self.task_type == 'worker':
      return len(self.jobs.get('chief', ())) + self.task_index
    return None

  @property
  def is_chief(self):
    return self.task_type == 'chief'

  @property
  def name(self):
    """'chief:0', 'worker:1', ...: how messages and log prefixes name it."""
    return '%s:%d' % (self.task_type, self.task_index)


def _fail(message, *args):
  raise ClusterError('TF_CONFIG: ' + message % args)


def parse_tf_config(text):
  """Parses and checks one TF_CONFIG string.

  Args:
    text: the JSON value of TF_CONFIG.

  Returns:
    A `Cluster`.

  Raises:
    ClusterError: not JSON, no chief, an address listed twice, an unknown
      or absent job, or a task that is not in the cluster.
  """
  try:
    config = json.loads(text)
  except ValueError as e:
    _fail('is not valid JSON (%s): %r', e, text[:200])
  if not isinstance(config, dict):
    _fail('must be a JSON object with "cluster" and "task", got %r.', config)
  cluster, task = config.get('cluster'), config.get('task')
  if not isinstance(cluster, dict) or not cluster:
    _fail('has no "cluster" (a dict {job: ["host:port", ...]}).')
  if not isinstance(task, dict):
    _fail('has no "task" (e.g. {"type": "worker", "index": 0}).')
  unknown = sorted(set(cluster) - set(_KNOWN_TASKS))
  if 'ps' in unknown:
    _fail('lists parameter servers ("ps"); training here all-reduces '
          'gradients between the chief and the workers. Drop the "ps" job.')
  if unknown:
    _fail('has unknown jobs %s; the jobs are %s.', unknown,
          ', '.join(_KNOWN_TASKS))
  jobs = {}
  seen = {}
  for job in _KNOWN_TASKS:
    addresses = cluster.get(job)
    if addresses is None:
      continue
    if isinstance(addresses, dict):  # {"0": "host:port"} is also accepted
      addresses = [addresses[key] for key in sorted(addresses, key=int)]
    if not isinstance(addresses, list) or not all(
        isinstance(a, str) and ':' in a for a in addresses):
      _fail('job "%s" must list "host:port" strings, got %r.', job,
            addresses)
    for index, address in enumerate(addresses):
      if address in seen:
        _fail('address %s is listed twice (%s and %s:%d); every task needs '
              'its own port.', address, seen[address], job, index)
      seen[address] = '%s:%d' % (job, index)
    jobs[job] = list(addresses)
  if len(jobs.get('chief', ())) != 1:
    _fail('needs exactly one "chief" task (it writes the checkpoints and '
          'summaries), found %d. Name the first training process "chief".',
          len(jobs.get('chief', ())))
  if len(jobs.get(EVALUATOR, ())) > 1:
    _fail('lists %d evaluators; at most one evaluates the checkpoints.',
          len(jobs[EVALUATOR]))
  task_type, task_index = task.get('type'), task.get('index', 0)
  if task_type not in jobs:
    _fail('this task\'s type %r is not a job of the cluster (%s).',
          task_type, ', '.join(sorted(jobs)))
  if (isinstance(task_index, bool) or not isinstance(task_index, int) or
      not 0 <= task_index < len(jobs[task_type])):
    _fail('this task (%s, index %r) is not in the cluster: job "%s" has %d '
          'task(s).', task_type, task_index, task_type,
          len(jobs[task_type]))
  return Cluster(jobs=jobs, task_type=task_type, task_index=task_index)


def read_tf_config(environ=None):
  """Reads and checks TF_CONFIG from `environ` (default: `os.environ`).

  Returns:
    A `Cluster`.

  Raises:
    ClusterError: TF_CONFIG is unset or bad (see `parse_tf_config`).
  """
  environ = os.environ if environ is None else environ
  text = environ.get('TF_CONFIG')
  if not text:
    raise ClusterError(
        'TF_CONFIG is not set: a multi-worker run needs it in every process '
        '(`python -m estimator_bf16.apps.launch --workers=N -- COMMAND` writes it '
        'for local runs; see docs/distribute.md).')
  return parse_tf_config(text)


def tf_config(jobs, task_type, task_index):
  """The TF_CONFIG JSON string for one task of `jobs` (a launcher's view)."""
  return json.dumps({'cluster': jobs,
                     'task': {'type': task_type, 'index': task_index}})
