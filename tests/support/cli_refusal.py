"""A command line that `python -m estimator_bf16` must refuse before running.

`refused(argv)` calls `estimator_bf16.apps.cli.main` in the test process
with the program runner replaced by one that fails the test, so a refusal
is checked without a subprocess and a command that would have run the
program fails loudly. The environment `cli.main` sets for a run is
restored afterwards.
"""

import io
import os
from unittest import mock


def refused(argv):
  """Runs `cli.main(argv)`; returns (exit code, what it wrote to stderr).

  Raises:
    AssertionError: the command started the program.
  """
  from estimator_bf16.apps import cli  # pylint: disable=g-import-not-at-top
  from estimator_bf16.runner import program as runner  # pylint: disable=g-import-not-at-top

  def must_not_run(*args, **kwargs):
    raise AssertionError('the program ran: %s %s' % (args, kwargs))

  with mock.patch.dict(os.environ), \
      mock.patch.object(runner, 'run_program', must_not_run), \
      mock.patch('sys.stderr', new_callable=io.StringIO) as stderr:
    code = cli.main(list(argv))
  return code, stderr.getvalue()
