"""Inspect or convert a checkpoint from the shell.

    python -m estimator_bf16.apps.ckpt inspect --input=gs://bucket/old/model.ckpt-1000
    python -m estimator_bf16.apps.ckpt convert --input=old/model.ckpt-1000 \\
        --output=new/model.ckpt-1000 [--strip_prefix=bfloat16/]

`convert` rewrites a checkpoint of an older convention (a `bfloat16/` name
prefix, weights stored as bfloat16) with float32 values and plain names;
the work is done by `estimator_bf16.safety.checkpoint_convert`. Exit status 2 on a
bad input or output.
"""

import sys

from absl import app
from absl import flags
import tensorflow as tf

from estimator_bf16.safety.checkpoint_convert import convert_checkpoint
from estimator_bf16.safety.checkpoint_convert import inspect_checkpoint
from estimator_bf16.safety.checkpoint_convert import OLD_PREFIX
from estimator_bf16.safety.checkpoint_convert import resolve_checkpoint


def _define_flags():
  flags.DEFINE_string('input', None, 'Checkpoint prefix or model_dir to read.')
  flags.DEFINE_string('output', None, 'Checkpoint prefix to write (convert).')
  flags.DEFINE_string('strip_prefix', OLD_PREFIX,
                      "Leading scope to remove from names ('' for none).")
  flags.DEFINE_bool('dry_run', False, 'Report only; write nothing.')
  flags.DEFINE_bool('overwrite', False, 'Replace an existing output.')
  flags.mark_flag_as_required('input')


def _main(argv):
  if len(argv) != 2 or argv[1] not in ('inspect', 'convert'):
    raise app.UsageError('usage: python -m estimator_bf16.apps.ckpt '
                         '{inspect,convert} --input=... [--output=...]')
  fl = flags.FLAGS
  try:
    if argv[1] == 'inspect':
      prefix = resolve_checkpoint(fl.input)
      variables = inspect_checkpoint(prefix)
      step = ('global step %d' % tf.train.load_variable(prefix, 'global_step')
              if 'global_step' in variables else 'no global_step in it')
      print('checkpoint: %s (%s)' % (prefix, step))
      for name, (dtype, shape) in sorted(variables.items()):
        flag = '  <- not float32' if dtype in ('bfloat16', 'float16') else ''
        print('%-60s %-9s %s%s' % (name, dtype, list(shape), flag))
      return 0
    if not fl.output and not fl.dry_run:
      raise app.UsageError('convert needs --output (or --dry_run).')
    report = convert_checkpoint(fl.input, fl.output or '', fl.strip_prefix,
                                fl.dry_run, fl.overwrite)
  except ValueError as e:
    print('error: %s' % e, file=sys.stderr)
    return 2
  print(report.summary())
  return 0


def main():
  _define_flags()
  app.run(lambda argv: sys.exit(_main(argv)))


if __name__ == '__main__':
  main()
