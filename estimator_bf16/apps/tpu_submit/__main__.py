"""`python -m estimator_bf16.apps.tpu_submit`: the `tpu-submit` program."""

import sys

from estimator_bf16.apps.tpu_submit import main as tpu_submit

if __name__ == '__main__':
  sys.exit(tpu_submit.main())
