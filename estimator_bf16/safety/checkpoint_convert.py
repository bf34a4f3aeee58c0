"""Checkpoint inspection and conversion to the float32-master convention.

Two older conventions cannot restore into the variables this package
builds: TensorFlow's contrib-era bfloat16 scope put every variable under a
`bfloat16/` name prefix, and some code stored weights themselves as
bfloat16. `convert` rewrites such a checkpoint with float32 values and plain
names, and reports what it changed. `python -m estimator_bf16.apps.ckpt` is the
command line for both.
"""

import dataclasses
import os
from typing import List, Tuple

import numpy as np
import tensorflow as tf

from estimator_bf16.precision.casting import HALF_DTYPES

OLD_PREFIX = 'bfloat16/'


@dataclasses.dataclass
class ConversionReport:
  """What `convert_checkpoint` did.

  Attributes:
    renamed: (old name, new name) pairs.
    cast: (name, old dtype name) of variables converted to float32.
    kept: names copied unchanged (neither renamed nor cast).
    total: number of variables in the checkpoint.
    output: the written checkpoint prefix ('' for a dry run).
  """
  renamed: List[Tuple[str, str]]
  cast: List[Tuple[str, str]]
  kept: List[str]
  total: int
  output: str = ''

  def summary(self):
    lines = ['%d variable(s): %d renamed, %d cast to float32, %d unchanged.' %
             (self.total, len(self.renamed), len(self.cast), len(self.kept))]
    lines += ['  renamed %s -> %s' % pair for pair in self.renamed]
    lines += ['  cast    %s (%s -> float32)' % pair for pair in self.cast]
    if self.output:
      lines.append('written to %s' % self.output)
    return '\n'.join(lines)


def resolve_checkpoint(path):
  """A model_dir resolves to its latest checkpoint prefix; a prefix stays.

  Raises:
    ValueError: there is no checkpoint at `path`.
  """
  if tf.io.gfile.isdir(path):
    latest = tf.train.latest_checkpoint(path)
    if latest is None:
      raise ValueError('%s is a directory without a checkpoint.' % path)
    return latest
  if not tf.io.gfile.glob(path + '.index'):
    raise ValueError('no checkpoint at %s (expected %s.index).' % (path, path))
  return path


def inspect_checkpoint(path):
  """Returns {name: (dtype name, shape)} for every variable in a checkpoint."""
  reader = tf.train.load_checkpoint(resolve_checkpoint(path))
  shapes = reader.get_variable_to_shape_map()
  return {name: (dtype.name, tuple(shapes[name]))
          for name, dtype in reader.get_variable_to_dtype_map().items()}


def convert_checkpoint(input_path, output_prefix, strip_prefix=OLD_PREFIX,
                       dry_run=False, overwrite=False):
  """Writes `input_path` again with float32 weights and unprefixed names.

  Args:
    input_path: a checkpoint prefix or a model_dir (its latest checkpoint).
    output_prefix: where to write, e.g. 'new_dir/model.ckpt-1000'.
    strip_prefix: a leading name scope to remove ('' removes nothing).
    dry_run: only report.
    overwrite: replace an existing checkpoint at `output_prefix`.

  Returns:
    A `ConversionReport`.

  Raises:
    ValueError: no input checkpoint, an existing output without
      `overwrite`, or two variables that would get the same name.
  """
  source = resolve_checkpoint(input_path)
  reader = tf.train.load_checkpoint(source)
  dtypes = reader.get_variable_to_dtype_map()
  renamed, cast, kept, targets = [], [], [], {}
  for name in sorted(dtypes):
    new_name = name
    if strip_prefix and name.startswith(strip_prefix):
      new_name = name[len(strip_prefix):]
      renamed.append((name, new_name))
    if new_name in targets:
      raise ValueError('both %r and %r would be named %r; pass another '
                       '--strip_prefix.' % (targets[new_name], name, new_name))
    targets[new_name] = name
    if dtypes[name] in HALF_DTYPES:
      cast.append((new_name, dtypes[name].name))
    elif new_name == name:
      kept.append(name)
  report = ConversionReport(renamed, cast, kept, total=len(targets))
  if dry_run:
    return report
  if tf.io.gfile.glob(output_prefix + '.index') and not overwrite:
    raise ValueError('%s already holds a checkpoint; pass overwrite=True '
                     '(--overwrite) to replace it.' % output_prefix)
  _write(reader, dtypes, targets, output_prefix)
  report.output = output_prefix
  return report


def _write(reader, dtypes, targets, output_prefix):
  """Saves the converted values through placeholders (no huge constants)."""
  with tf.Graph().as_default():
    feeds, variables = {}, []
    for new_name, old_name in targets.items():
      dtype = tf.float32 if dtypes[old_name] in HALF_DTYPES else dtypes[old_name]
      value = reader.get_tensor(old_name)
      if dtype == tf.float32 and dtypes[old_name] in HALF_DTYPES:
        value = np.asarray(value).astype(np.float32)
      placeholder = tf.compat.v1.placeholder(dtype, np.shape(value))
      variables.append(tf.compat.v1.Variable(placeholder, name=new_name,
                                             dtype=dtype))
      feeds[placeholder] = value
    saver = tf.compat.v1.train.Saver(
        {v.op.name: v for v in variables}, write_version=2)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.variables_initializer(variables), feeds)
      directory = os.path.dirname(output_prefix)
      if directory:
        tf.io.gfile.makedirs(directory)
      # The checkpoint files are complete before the state file names them,
      # so a crash leaves either no checkpoint or a whole one.
      saver.save(sess, output_prefix, write_meta_graph=False)
