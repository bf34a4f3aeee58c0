"""`python -m estimator_bf16 run|check ...`: see `estimator_bf16.apps.cli`."""

import sys

from estimator_bf16.apps import cli

if __name__ == '__main__':
  sys.exit(cli.main())
