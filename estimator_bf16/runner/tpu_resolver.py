"""A local stand-in for `TPUClusterResolver` when no TPU is named or present.

TPU programs written the tensorflow/tpu way build the resolver before they
look at `--use_tpu`:

    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(FLAGS.tpu)
    config = tf.compat.v1.estimator.tpu.RunConfig(cluster=resolver, ...)

With no TPU name (`''` or `None`) and no TPU around, TensorFlow raises
`ValueError: Please provide a TPU Name to connect to`, so such a program
cannot even start on a laptop with `--use_tpu=false`. Inside
`substitute_empty_name()`, exactly that request gets a `LocalClusterResolver`
(master `''`: the in-process session on this CPU) and a log line says so. A
named TPU (`'local'`, a name, a `grpc://` address) and any request made on a
host that has a TPU (a `TPU_NAME` in the environment, TPU devices under
`/dev`) are passed to TensorFlow untouched.
"""

import contextlib
import glob
import os

from absl import logging
import tensorflow as tf

from estimator_bf16.platform import patching

# Where Cloud TPU VMs expose their chips: /dev/accel* on v2-v4, VFIO groups
# on v5e/v5p and later.
_TPU_DEVICE_GLOBS = ('/dev/accel*', '/dev/vfio/[0-9]*')
_TPU_ENV = ('TPU_NAME', 'TPU_WORKER_ID', 'TPU_ACCELERATOR_TYPE')


class LocalClusterResolver(tf.distribute.cluster_resolver.ClusterResolver):
  """What a TPU program sees instead of a TPU: no cluster, local master.

  `RunConfig(cluster=...)` reads `master()` (`''` runs the in-process
  session) and `cluster_spec()` (empty: no cluster_def is merged into the
  session config), which is what `TPUEstimator(use_tpu=False)` needs.

  Attributes:
    requested: the TPU name the program asked for (`''` or None).
  """

  def __init__(self, requested=None):
    self.requested = requested

  def cluster_spec(self):
    return tf.train.ClusterSpec({})

  def master(self, task_type=None, task_id=None, rpc_layer=None):
    del task_type, task_id, rpc_layer
    return ''

  def get_master(self):
    return ''

  def num_accelerators(self, task_type=None, task_id=None,
                       config_proto=None):
    del task_type, task_id, config_proto
    return {}

  @property
  def environment(self):
    return ''

  def __repr__(self):
    return 'LocalClusterResolver(requested=%r)' % (self.requested,)


def tpu_present():
  """True if this host has, or is configured for, a TPU.

  Returns:
    bool: a TPU variable is set in the environment, or TPU devices exist.
  """
  if any(os.environ.get(name) for name in _TPU_ENV):
    return True
  return any(glob.glob(pattern) for pattern in _TPU_DEVICE_GLOBS)


def _requested_name(args, kwargs):
  """The `tpu` argument of a TPUClusterResolver call."""
  if args:
    return args[0]
  return kwargs.get('tpu')


def _swap():
  """Replaces `TPUClusterResolver.__new__`; returns the Patcher's undo list.

  The swap exists because TensorFlow raises in the resolver's constructor
  when no TPU is named, before the program reads `--use_tpu`. It is undone
  when the last `substitute_empty_name()` exits.
  """
  resolver_class = tf.distribute.cluster_resolver.TPUClusterResolver
  original = vars(resolver_class).get('__new__', patching.MISSING)

  def new(cls, *args, **kwargs):
    requested = _requested_name(args, kwargs)
    if cls is resolver_class and not requested and not tpu_present():
      stand_in = LocalClusterResolver(requested)
      logging.warning(
          'TPUClusterResolver(tpu=%r): no TPU is named and none is attached '
          'to this host, so a local stand-in (master \'\', no cluster) is '
          'used and the program runs on this CPU. Pass a TPU name to use a '
          'TPU; named TPUs are never substituted.', requested)
      users = _PATCHER.users
      if users and users[-1][0] is not None:
        users[-1][0](stand_in)
      return stand_in
    if original is not patching.MISSING:
      return original(cls, *args, **kwargs)
    return object.__new__(cls)

  resolver_class.__new__ = new
  return [(resolver_class, '__new__', original)]


# Its users are one `[on_substitute]` list per active
# `substitute_empty_name()`, innermost last: a substitution is reported to
# the innermost.
_PATCHER = patching.Patcher(_swap)


@contextlib.contextmanager
def substitute_empty_name(on_substitute=None):
  """Inside, `TPUClusterResolver('')` / `(None)` gives a local stand-in.

  Only when no TPU is present (`tpu_present()` is False); a non-empty name
  is never substituted. The class is patched at one point, its `__new__`:
  every spelling a program may use (`tf.distribute.cluster_resolver`,
  `tf.compat.v1.distribute.cluster_resolver`, the internal module) is the
  same class object, and returning an object that is not an instance of it
  makes Python skip the real `__init__`, which is what raises. Nested and
  concurrent uses share the one patch (`patching.Patcher`).

  Args:
    on_substitute: optional `fn(stand_in)` called for each substitution
      made while this is the innermost active use.

  Yields:
    None. On exit (also on an exception) the class is as before once no
    other use is active.
  """
  user = [on_substitute]  # A fresh list: removed by identity on exit.
  with _PATCHER.active(user):
    yield
