"""`python -m estimator_bf16 run|check ...`: see `estimator_bf16.cli`."""

import sys

from estimator_bf16 import cli

if __name__ == '__main__':
  sys.exit(cli.main())
