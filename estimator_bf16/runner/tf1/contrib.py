"""`tf.contrib` for TF 1.x programs, mapped to its successors.

TensorFlow 2 removed `tf.contrib`; most of what TPUEstimator programs used
from it lives on elsewhere (`tf.compat.v1.estimator.tpu`, `tf.data.
experimental`, tf-slim, ...). `CONTRIB` is the one table of that mapping:
the namespaces below, the coverage table of docs/tf1.md
(`coverage_markdown()`), and the tests all read it.

A name is looked up in a mapping's `renames` first (symbols whose home or
signature changed), then in each of its `sources` in order. Everything is
resolved when it is read, never cached: on TensorFlow 2.16+
`tf.compat.v1.estimator` exists only while the compat backend is installed.

A name with no successor raises `UnmappedContribError` (an ImportError: a
`from tensorflow.contrib.x import y` must not turn it into Python's own
"cannot import name"), whose one-line message names the symbol and the
file:line of the program code that used it.
"""

import dataclasses
import importlib
import os
import sys
import types
from typing import Callable, Dict, Tuple

import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.platform import shown_paths
from estimator_bf16.runner import results
from estimator_bf16.runner.tf1 import hparams

# The installed package's folder (not this subpackage's): its code is never
# the program's.
_PACKAGE_DIR = os.path.abspath(eb.__path__[0])


class UnmappedContribError(results.Refusal, ImportError):
  """A `tf.contrib` name without a successor; the message is one line."""


# Program code, as opposed to this package, TensorFlow or a library, is the
# first frame outside this package and the standard import machinery.
def caller_location():
  """'file:line' of the innermost frame that is not this package's own."""
  frame = sys._getframe(1)  # pylint: disable=protected-access
  while frame is not None:
    path = frame.f_code.co_filename
    if not (path.startswith(_PACKAGE_DIR) or path.startswith('<')):
      return shown_paths.shown_location(path, frame.f_lineno)
    frame = frame.f_back
  return 'an unknown line'


def _attribute_path(path):
  """A getter for 'tf.a.b' (real TensorFlow's API) or an importable module."""
  def resolve():
    head, _, rest = path.partition('.')
    if head != 'tf':
      return importlib.import_module(path)
    obj = tf
    for part in rest.split('.'):
      obj = getattr(obj, part)
    return obj
  return resolve


def _quiet_getattr(module, name):
  """`getattr(module, name)`, without TensorFlow's renamed-name notice.

  TensorFlow's API modules are wrappers that log "From FILE:LINE: The name
  tf.X is deprecated" when a name they consider moved is read, blaming the
  line that read it. Here that line would be this module's, and the path
  is the mapping's choice, not the program's: read the name from the
  module the wrapper wraps (the wrapper only adds that notice and the lazy
  loading of submodules, for which it is still asked).
  """
  wrapped = vars(module).get('_tfmw_wrapped_module')
  if wrapped is not None and name in vars(wrapped):
    return vars(wrapped)[name]
  return getattr(module, name)


def _async_checkpoint_hook():
  # TensorFlow 2.15 still ships the TPU hook (outside its public API); the
  # compat backend has none, and the synchronous hook takes the same
  # arguments.
  try:
    return importlib.import_module(
        'tensorflow.python.tpu.async_checkpoint').AsyncCheckpointSaverHook
  except ImportError:
    return tf.compat.v1.train.CheckpointSaverHook


# contrib.summary was TF 1.x's take on what became tf.summary (v2): the
# writer and record_if carry over; the ops take `family` and default the
# step to the global step, which tf.summary needs spelled out.
def _summary_op(kind, rename=None):
  def op(name, tensor, *args, family=None, step=None, **kwargs):
    if step is None:
      step = tf.compat.v1.train.get_global_step()
    for old, new in (rename or {}).items():
      if old in kwargs:
        kwargs[new] = kwargs.pop(old)
    name = '%s/%s' % (family, name) if family else name
    return getattr(tf.compat.v2.summary, kind)(name, tensor, step, *args,
                                               **kwargs)
  op.__name__ = kind
  op.__doc__ = ('tf.contrib.summary.%s: tf.summary.%s with `family` as a '
                'name prefix and the global step by default.' % (kind, kind))
  return op


def _record_summaries_every_n_global_steps(n, global_step=None):
  """tf.contrib.summary's: record only at steps divisible by `n`."""
  if global_step is None:
    global_step = tf.compat.v1.train.get_or_create_global_step()
  # A callable, so the condition is read when each summary is written.
  return tf.compat.v2.summary.record_if(
      lambda: tf.equal(global_step % n, 0))


def _module(name):
  """A getter that imports module `name` (a renames entry)."""
  return lambda: importlib.import_module(name)


def _batch_and_drop_remainder(batch_size):
  return lambda dataset: dataset.batch(batch_size, drop_remainder=True)


def _padded_batch_and_drop_remainder(batch_size, padded_shapes,
                                     padding_values=None):
  return lambda dataset: dataset.padded_batch(
      batch_size, padded_shapes, padding_values, drop_remainder=True)


@dataclasses.dataclass(frozen=True)
class Mapping:
  """One `tf.contrib` module and where its names went.

  Attributes:
    successor: the successor modules, as the docs name them.
    sources: attribute paths searched in order ('tf.compat.v1.tpu', or an
      importable module such as 'tf_slim').
    renames: {contrib name: zero-argument getter} for names that moved or
      changed signature; searched before `sources`.
    modules: dotted module paths under the contrib module that programs
      import from (`tensorflow.contrib.tpu.python.tpu.tpu_estimator`); each
      stands for the whole mapping.
    missing: {contrib name: what to do instead}, for names known to have no
      successor.
    note: what differs, for the docs.
  """
  successor: Tuple[str, ...]
  sources: Tuple[str, ...]
  renames: Dict[str, Callable[[], object]] = dataclasses.field(
      default_factory=dict)
  modules: Tuple[str, ...] = ()
  missing: Dict[str, str] = dataclasses.field(default_factory=dict)
  note: str = ''

  def lookup(self, name):
    """The object `name` maps to; AttributeError if it has none."""
    if name in self.renames:
      return self.renames[name]()
    for source in self.sources:
      try:
        return _quiet_getattr(_attribute_path(source)(), name)
      except AttributeError:
        continue
    raise AttributeError(name)

  def names(self):
    """The public names of every source and rename, sorted."""
    found = set(self.renames)
    for source in self.sources:
      try:
        found.update(n for n in dir(_attribute_path(source)())
                     if not n.startswith('_'))
      except (AttributeError, ImportError):
        continue
    return sorted(found)


_TPU_MODULES = tuple('python.tpu.' + m for m in (
    'tpu_estimator', 'tpu_config', 'tpu_optimizer', 'bfloat16', 'tpu',
    'tpu_function', 'training_loop', 'async_checkpoint')) + ('python.ops',)

# The one table. Keys are `tf.contrib` module names.
CONTRIB = {
    'tpu': Mapping(
        successor=('tf.compat.v1.estimator.tpu', 'tf.compat.v1.tpu'),
        sources=('tf.compat.v1.estimator.tpu', 'tf.compat.v1.tpu',
                 'tf.compat.v1.tpu.experimental'),
        renames={'AsyncCheckpointSaverHook': _async_checkpoint_hook,
                 # `from tensorflow.contrib.tpu.python.ops import tpu_ops`:
                 # the module moved into TensorFlow's own tpu package.
                 'tpu_ops': _module('tensorflow.python.tpu.ops.tpu_ops')},
        note='`AsyncCheckpointSaverHook` is the synchronous '
        '`CheckpointSaverHook` on TensorFlow 2.16+',
        modules=_TPU_MODULES),
    'cluster_resolver': Mapping(
        successor=('tf.distribute.cluster_resolver',),
        sources=('tf.distribute.cluster_resolver',),
        modules=('python.training',)),
    'data': Mapping(
        successor=('tf.data.experimental', 'tf.data'),
        note='`batch_and_drop_remainder` and '
        '`padded_batch_and_drop_remainder` become `batch(..., '
        'drop_remainder=True)`',
        sources=('tf.compat.v1.data.experimental', 'tf.compat.v1.data'),
        renames={
            'batch_and_drop_remainder':
                lambda: _batch_and_drop_remainder,
            'padded_batch_and_drop_remainder':
                lambda: _padded_batch_and_drop_remainder,
        }),
    'layers': Mapping(
        successor=('tf_slim',),
        sources=('tf_slim', 'tf_slim.layers'),
        # The module paths Inception-era programs import from.
        renames={'regularizers': _module('tf_slim.layers.regularizers'),
                 'initializers': _module('tf_slim.layers.initializers'),
                 'layers': _module('tf_slim.layers.layers')},
        modules=('python.layers',)),
    'slim': Mapping(
        successor=('tf_slim',),
        sources=('tf_slim', 'tf_slim.nets'),
        modules=('nets',)),
    'framework': Mapping(
        successor=('tf_slim', 'tf.nest'),
        sources=('tf_slim',),
        renames={'nest': lambda: tf.nest},
        modules=('python.ops',)),
    'keras': Mapping(
        successor=('tf.keras',),
        sources=('tf.compat.v1.keras',)),
    'util': Mapping(
        successor=('tf.make_ndarray', 'tf.make_tensor_proto'),
        sources=('tf.compat.v1',),
        renames={'constant_value': lambda: tf.get_static_value}),
    'distribute': Mapping(
        successor=('tf.distribute',),
        # TF 1.x's classes (TPUStrategy with steps_per_run, the parameter
        # server strategy Estimators take), not TF 2's of the same names.
        sources=('tf.compat.v1.distribute',
                 'tf.compat.v1.distribute.experimental')),
    'training': Mapping(
        successor=('tf.compat.v1.train',),
        note='`HParams` is `estimator_bf16.runner.tf1.hparams.HParams`',
        sources=('tf.compat.v1.train',),
        renames={'HParams': lambda: hparams.HParams},
        modules=('python.training.evaluation',
                 'python.training.training',
                 'python.training.hparam'),
        missing={'stratified_sample': 'TensorFlow 2 has none; '
                 'tf.data.experimental.rejection_resample resamples a '
                 'dataset by class'}),
    'summary': Mapping(
        successor=('tf.summary',),
        note='`scalar`, `histogram`, `image`, `audio` take `family` (a name '
        'prefix) and default `step` to the global step; '
        '`always_record_summaries`, `record_summaries_every_n_global_steps`, '
        '`all_summary_ops`',
        sources=('tf.compat.v2.summary',),
        renames={
            'scalar': lambda: _summary_op('scalar'),
            'histogram': lambda: _summary_op('histogram'),
            'image': lambda: _summary_op('image',
                                         {'max_images': 'max_outputs'}),
            'audio': lambda: _summary_op('audio'),
            'always_record_summaries':
                lambda: lambda: tf.compat.v2.summary.record_if(True),
            'never_record_summaries':
                lambda: lambda: tf.compat.v2.summary.record_if(False),
            'record_summaries_every_n_global_steps':
                lambda: _record_summaries_every_n_global_steps,
            # TF 1.x's older spelling of create_file_writer.
            'create_summary_file_writer':
                lambda: tf.compat.v2.summary.create_file_writer,
            'all_summary_ops':
                lambda: tf.compat.v1.summary.all_v2_summary_ops,
            'initialize': lambda: tf.compat.v1.summary.initialize,
        }),
    'rnn': Mapping(
        successor=('tf.compat.v1.nn.rnn_cell', 'tf.compat.v1.nn'),
        sources=('tf.compat.v1.nn.rnn_cell', 'tf.compat.v1.nn')),
}


def _unmapped(dotted, hint=None):
  where = caller_location()
  if hint is None:
    hint = ('estimator_bf16 maps tf.contrib.{%s}; anything else needs an '
            'edit' % ','.join(sorted(CONTRIB)))
  return UnmappedContribError('%s: %s has no successor in TensorFlow %s (%s).'
                              % (where, dotted, tf.__version__, hint))


class Namespace(types.ModuleType):
  """`tf.contrib` (mapping None) or one of its modules, resolved on read."""

  def __init__(self, dotted, mapping=None, prefix=''):
    super().__init__(dotted, 'TF 1.x %s, mapped by estimator_bf16.' % dotted)
    self._mapping = mapping
    self._prefix = prefix  # '' or 'python.tpu.' below a mapped module.

  def _child_modules(self, name):
    path = self._prefix + name
    return [m for m in self._mapping.modules
            if m == path or m.startswith(path + '.')]

  def __getattr__(self, name):
    if name.startswith('__'):
      raise AttributeError(name)
    dotted = '%s.%s' % (self.__name__, name)
    if self._mapping is None:
      if name in CONTRIB:
        return Namespace(dotted, CONTRIB[name])
      raise _unmapped(dotted)
    mapping = self._mapping
    # A module path that is not a module itself ('python', 'python.tpu')
    # only leads on; the mapped module and its listed submodules hold names.
    holds_names = not self._prefix or self._prefix[:-1] in mapping.modules
    if holds_names:
      try:
        return mapping.lookup(name)
      except AttributeError:
        pass
    if self._child_modules(name):
      return Namespace(dotted, mapping, self._prefix + name + '.')
    raise _unmapped(dotted, mapping.missing.get(name))

  def __dir__(self):
    if self._mapping is None:
      return sorted(CONTRIB)
    return self._mapping.names()


def contrib():
  """A fresh `tf.contrib` namespace."""
  return Namespace('tf.contrib')


def coverage_markdown():
  """docs/tf1.md's table of the mapping: one row per contrib module."""
  lines = ['| `tf.contrib.` | maps to | notes |', '| --- | --- | --- |']
  for name in sorted(CONTRIB):
    mapping = CONTRIB[name]
    notes = [mapping.note] if mapping.note else []
    if mapping.modules:
      notes.append('also imported as %s' % ', '.join(
          '`%s.%s`' % (name, m) for m in mapping.modules))
    lines.append('| `%s` | %s | %s |' % (
        name, ', '.join('`%s`' % s for s in mapping.successor),
        '; '.join(notes)))
  return '\n'.join(lines) + '\n'
