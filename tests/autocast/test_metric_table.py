"""Every tf.compat.v1.metrics function, one row each, under bfloat16 (issue 45).

A one-layer model_fn in EVAL mode hands each metric what model_fns hand it
(logits, softmax probabilities, a class's probability, argmax classes,
thresholded predictions), in the two forms model_fns use:

* `eval_metric_ops`: the metric is built inside the model_fn, under
  autocast, from the bfloat16 network's outputs;
* `eval_metrics=(metric_fn, tensors)`: the wrapper hands `metric_fn` the
  tensors in float32 and TPUEstimator calls it after the model_fn.

Each row asserts that the metric's value and update have the dtype of the
float32 build (float32, or float64 where TensorFlow's metric is float64),
that its variables have the float32 build's dtypes, that no bfloat16 tensor
lies between the metric's arguments and its value or update (nothing the
metric accumulates is rounded to bfloat16), and that its value is the
float32 metric of the same arguments up to float32 arithmetic and within
bfloat16 rounding of the float32 build. All rows of a form share one
graph; a few representative rows also run through
`make_tpu_estimator(...).evaluate`, which must give the graph's values.
"""

import collections
import functools
import shutil
import tempfile

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.precision import casting

M = tf.compat.v1.metrics
CLASSES = 5
BATCH = 16
POSITIVE = 2  # The class whose probability the binary metrics read.
THRESHOLDS = [0.25, 0.5, 0.75]
_RNG = np.random.RandomState(45)
FEATURES = _RNG.randn(BATCH, 6).astype(np.float32)
KERNEL = (_RNG.randn(6, CLASSES) * 0.7).astype(np.float32)
# Labels the float32 network mostly gets right, so that counts, curves and
# top-k metrics are not all zero.
LABELS = np.argmax(FEATURES @ KERNEL + _RNG.randn(BATCH, CLASSES) * 0.8,
                   -1).astype(np.int32)

# Each metric's arguments, from what the model_fn derives (`_derived`):
# (positional tensors, other keyword arguments).
_ROWS = {
    'accuracy': lambda o: ((o['labels'], o['classes']), {}),
    'auc': lambda o: ((o['positive'], o['prob']), {}),
    'average_precision_at_k': lambda o: ((o['labels64'], o['logits']),
                                         {'k': 2}),
    'false_negatives': lambda o: ((o['positive'], o['predicted']), {}),
    'false_negatives_at_thresholds': lambda o: (
        (o['positive'], o['prob']), {'thresholds': THRESHOLDS}),
    'false_positives': lambda o: ((o['positive'], o['predicted']), {}),
    'false_positives_at_thresholds': lambda o: (
        (o['positive'], o['prob']), {'thresholds': THRESHOLDS}),
    'mean': lambda o: ((o['prob'],), {}),
    'mean_absolute_error': lambda o: ((o['one_hot'], o['probs']), {}),
    'mean_cosine_distance': lambda o: ((o['one_hot'], o['unit']), {'dim': 1}),
    'mean_iou': lambda o: ((o['labels'], o['classes']),
                           {'num_classes': CLASSES}),
    'mean_per_class_accuracy': lambda o: ((o['labels'], o['classes']),
                                          {'num_classes': CLASSES}),
    'mean_relative_error': lambda o: ((o['one_hot'], o['probs'],
                                       o['one_hot'] + 1.0), {}),
    'mean_squared_error': lambda o: ((o['one_hot'], o['probs']), {}),
    'mean_tensor': lambda o: ((o['probs'],), {}),
    'percentage_below': lambda o: ((o['prob'],), {'threshold': 0.5}),
    'precision': lambda o: ((o['positive'], o['predicted']), {}),
    'precision_at_k': lambda o: ((o['labels64'], o['logits']), {'k': 2}),
    'precision_at_thresholds': lambda o: ((o['positive'], o['prob']),
                                          {'thresholds': THRESHOLDS}),
    'precision_at_top_k': lambda o: ((o['labels64'], o['top_2']), {'k': 2}),
    'recall': lambda o: ((o['positive'], o['predicted']), {}),
    'recall_at_k': lambda o: ((o['labels64'], o['logits']), {'k': 2}),
    'recall_at_thresholds': lambda o: ((o['positive'], o['prob']),
                                       {'thresholds': THRESHOLDS}),
    'recall_at_top_k': lambda o: ((o['labels64'], o['top_2']), {'k': 2}),
    'root_mean_squared_error': lambda o: ((o['one_hot'], o['probs']), {}),
    'sensitivity_at_specificity': lambda o: ((o['positive'], o['prob']),
                                             {'specificity': 0.6}),
    # Deprecated aliases of average_precision_at_k / precision_at_k, still
    # exported (and still called by old model_fns).
    'sparse_average_precision_at_k': lambda o: ((o['labels64'], o['logits']),
                                                {'k': 2}),
    'sparse_precision_at_k': lambda o: ((o['labels64'], o['logits']),
                                        {'k': 2}),
    'specificity_at_sensitivity': lambda o: ((o['positive'], o['prob']),
                                             {'sensitivity': 0.6}),
    'true_negatives': lambda o: ((o['positive'], o['predicted']), {}),
    'true_negatives_at_thresholds': lambda o: (
        (o['positive'], o['prob']), {'thresholds': THRESHOLDS}),
    'true_positives': lambda o: ((o['positive'], o['predicted']), {}),
    'true_positives_at_thresholds': lambda o: (
        (o['positive'], o['prob']), {'thresholds': THRESHOLDS}),
}

# Public names of tf.compat.v1.metrics that have no row, with the reason.
# Every function takes (labels, predictions)-like arguments today, so all
# have one; a name TensorFlow adds must get a row or a reason here.
_NOT_COVERED = {}

OPS = 'eval_metric_ops'
FN = 'eval_metrics'
# Rows that also run through make_tpu_estimator(...).evaluate: a count, a
# curve, a float32 mean of bfloat16 errors, a float64 confusion matrix and
# a top-k metric.
_ESTIMATOR_ROWS = ('accuracy', 'auc', 'mean_absolute_error', 'mean_iou',
                   'recall_at_k')


def setUpModule():
  tf.compat.v1.disable_eager_execution()


def _derived(labels, logits, probs):
  """What model_fns hand metrics, derived from the network's outputs."""
  prob = probs[:, POSITIVE]
  return {
      'labels': labels,
      'labels64': tf.cast(labels, tf.int64),
      'positive': tf.equal(labels, POSITIVE),
      'one_hot': tf.one_hot(labels, CLASSES),
      'logits': logits,
      'probs': probs,
      'prob': prob,
      'predicted': prob > 0.5,
      'classes': tf.argmax(logits, -1, output_type=tf.int32),
      'top_2': tf.cast(tf.nn.top_k(logits, 2)[1], tf.int64),
      'unit': tf.nn.l2_normalize(logits, -1),
  }


# One row as built: the metric's tensor and other arguments, the variables
# it made, its (value, update) pair, or the error its build raised.
_Row = collections.namedtuple('_Row', 'args kwargs variables metric error')


def _metrics(o, names, built):
  """Builds the rows `names` from `_derived` outputs `o` into `built`."""
  metrics = {}
  for name in names:
    args, kwargs = _ROWS[name](o)
    collection = tf.compat.v1.get_collection_ref(
        tf.compat.v1.GraphKeys.METRIC_VARIABLES)
    first = len(collection)
    try:
      metric = getattr(M, name)(*args, **kwargs)
    except Exception as error:  # pylint: disable=broad-except
      # The row's own test reports it; the other rows still build.
      built[name] = _Row(args, kwargs, (), None, error)
      continue
    built[name] = _Row(args, kwargs, list(collection[first:]), metric, None)
    metrics[name] = metric
  return metrics


def _model_fn(form, names, built, seen):
  """A one-layer EVAL model_fn whose metrics are the rows `names`."""

  def model_fn(features, labels, mode):
    logits = tf.compat.v1.layers.dense(
        features, CLASSES, kernel_initializer=tf.constant_initializer(KERNEL),
        name='logits')
    probs = tf.nn.softmax(logits)
    built['network'] = (logits, probs)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if form == OPS:
      return tf.compat.v1.estimator.EstimatorSpec(
          mode, loss=loss,
          eval_metric_ops=_metrics(_derived(labels, logits, probs), names,
                                   built))

    def metric_fn(labels, logits, probs):
      seen.append((logits.dtype, probs.dtype))
      return _metrics(_derived(labels, logits, probs), names, built)

    return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
        mode, loss=loss, eval_metrics=(metric_fn, {
            'labels': labels, 'logits': logits, 'probs': probs}))

  return model_fn


def _value_of(tensor_like):
  return tensor_like if isinstance(tensor_like, tf.Operation) else tf.identity(
      tensor_like)


def _run_metrics(built):
  """Runs every built row's update once; returns {name: value}."""
  rows = {name: row for name, row in built.items()
          if isinstance(row, _Row) and row.error is None}
  with tf.compat.v1.Session() as sess:
    sess.run([tf.compat.v1.global_variables_initializer(),
              tf.compat.v1.local_variables_initializer()])
    sess.run([_value_of(row.metric[1]) for row in rows.values()])
    return sess.run({name: row.metric[0] for name, row in rows.items()})


@functools.lru_cache(maxsize=None)
def _graph(form, precision):
  """Builds and runs every row in `form` and `precision`, in one graph.

  Returns:
    (built rows, {name: value}, {name: fetched float32 args}, the dtypes
    metric_fn received, the graph).
  """
  graph = tf.Graph()
  built, seen = {}, []
  with graph.as_default():
    spec = eb.wrap_model_fn(_model_fn(form, sorted(_ROWS), built, seen),
                            precision)(
                                tf.constant(FEATURES), tf.constant(LABELS),
                                'eval')
    if form == FN:
      # What TPUEstimator does off the TPU once the model_fn has returned.
      fn, tensors = spec.eval_metrics
      built['handed'] = tensors
      fn(**tensors)
    values = _run_metrics(built)
    # The arguments as the metrics got them, in float32, for the references
    # below: as rounded (a plain cast: autocast is off here), and as the
    # network computed them (a softmax's float32 result, which autocast
    # hands float32 ops instead of its rounding).
    args = {(name, how): [cast(a) if a.dtype == tf.bfloat16 else a
                          for a in row.args]
            for name, row in built.items()
            if isinstance(row, _Row) and row.error is None
            for how, cast in (('rounded', lambda a: tf.cast(a, tf.float32)),
                              ('exact', casting.to_float32))}
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      fetched = sess.run(args)
  return built, values, fetched, seen, graph


@functools.lru_cache(maxsize=None)
def _reference(form):
  """Each row's float32 metric of the bfloat16 build's fetched arguments.

  Returns:
    {(name, 'rounded' or 'exact'): value}: of the arguments as bfloat16
    roundings, and as the float32 values autocast rounded (where it did).
  """
  rows, _, fetched, _, _ = _graph(form, 'bfloat16')
  built = {}
  with tf.Graph().as_default():
    for (name, how), args in fetched.items():
      metric = getattr(M, name)(*[tf.constant(a) for a in args],
                                **rows[name].kwargs)
      built[name, how] = _Row((), {}, (), metric, None)
    return _run_metrics(built)


def _reaches(tensors, target):
  """True if one of `tensors` is computed from `target`."""
  pending, seen = list(tensors), set()
  while pending:
    tensor = pending.pop()
    if tensor.ref() == target.ref():
      return True
    if tensor.ref() not in seen:
      seen.add(tensor.ref())
      pending.extend(tensor.op.inputs)
  return False


def _bfloat16_inside(row):
  """Non-constant bfloat16 tensors between the row's arguments and metric."""
  stop = {a.ref() for a in row.args}
  seen = {}
  pending = [t for part in row.metric for t in (
      part.op.inputs if isinstance(part, tf.Operation) else [part])]
  pending += [t for part in row.metric
              for op in ([part] if isinstance(part, tf.Operation)
                         else [part.op])
              for control in op.control_inputs for t in control.outputs]
  while pending:
    tensor = pending.pop()
    if tensor.ref() in seen or tensor.ref() in stop:
      continue
    seen[tensor.ref()] = tensor
    # bfloat16 constants (the 0 and 1 of a range assertion, cast to the
    # predictions' dtype) are exact: no value of the network is rounded.
    if tensor.op.type == 'Const' or (
        tensor.op.type == 'Cast' and tensor.op.inputs[0].op.type == 'Const'):
      continue
    pending.extend(tensor.op.inputs)
    pending.extend(t for op in tensor.op.control_inputs for t in op.outputs)
  return sorted(t.name for t in seen.values()
                if t.dtype.base_dtype == tf.bfloat16 and
                not (t.op.type == 'Const' or (
                    t.op.type == 'Cast' and
                    t.op.inputs[0].op.type == 'Const')))


def _dtype(tensor_like):
  if isinstance(tensor_like, tf.Operation):
    return None
  return tensor_like.dtype.base_dtype


_TABLE = [('%s_%s' % (name, form), name, form)
          for name in sorted(_ROWS) for form in (OPS, FN)]


@pytest.mark.slow
class MetricTableTest(tf.test.TestCase, parameterized.TestCase):

  def test_every_public_metric_has_a_row(self):
    public = {name for name in dir(M) if not name.startswith('_')}
    self.assertEqual(public - set(_ROWS) - set(_NOT_COVERED), set())
    self.assertEqual(set(_ROWS) - public, set())

  @parameterized.named_parameters(*_TABLE)
  def test_float32_metric_computed_in_float32(self, name, form):
    built, values, _, _, graph = _graph(form, 'bfloat16')
    row = built[name]
    if row.error is not None:
      raise row.error
    float32_built, float32_values, _, _, _ = _graph(OPS, 'float32')
    float32_row = float32_built[name]
    with graph.as_default():
      logits, _ = built['network']
      # The metric reads the bfloat16 layer's results.
      self.assertEqual(logits.dtype, tf.bfloat16)
      self.assertTrue(_reaches(row.args, logits))
      if form == FN:
        self.assertEqual({t.dtype for t in built['handed'].values()
                          if t.dtype.is_floating}, {tf.float32})
      value, update = row.metric
      self.assertEqual(value.dtype, float32_row.metric[0].dtype)
      self.assertIn(value.dtype, (tf.float32, tf.float64))
      self.assertEqual(_dtype(update), _dtype(float32_row.metric[1]))
      self.assertNotEqual(_dtype(update), tf.bfloat16)
      self.assertNotEmpty(row.variables)
      self.assertEqual(
          [v.dtype.base_dtype for v in row.variables],
          [v.dtype.base_dtype for v in float32_row.variables])
      self.assertNotIn(tf.bfloat16,
                       [v.dtype.base_dtype for v in row.variables])
      self.assertEqual(_bfloat16_inside(row), [])
    got = values[name]
    if form == OPS:
      # Float32 arithmetic on the same arguments: their bfloat16 roundings,
      # or where a float32 op reads a softmax, its float32 result (a cast
      # of the rounding reads the rounding).
      references = [_reference(form)[name, how] for how in ('rounded',
                                                            'exact')]
      self.assertTrue(
          any(np.allclose(got, ref, rtol=1e-5, atol=1e-6)
              for ref in references), (got, references))
    # The float32 build: its predictions differ by bfloat16 rounding of the
    # layer's inputs, which moves no example across a threshold here.
    self.assertAllClose(got, float32_values[name], rtol=2e-2, atol=2e-3)


@pytest.mark.slow
class EstimatorMetricTest(tf.test.TestCase):
  """Representative rows through make_tpu_estimator(...).evaluate."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model_dir = tempfile.mkdtemp(prefix='metric_table_')
    cls.results = {}
    cls.seen = []

    def input_fn(params):
      del params
      return tf.data.Dataset.from_tensors((FEATURES, LABELS)).repeat()

    def estimator(form, precision):
      model_fn = _model_fn(form, _ESTIMATOR_ROWS, {}, cls.seen)

      def with_params(features, labels, mode, params):
        del params
        return model_fn(features, labels, mode)

      return eb.make_tpu_estimator(
          with_params, model_dir=cls.model_dir, precision=precision,
          train_batch_size=BATCH, eval_batch_size=BATCH)

    # evaluate reads a checkpoint: a float32 one of the initial weights
    # (the spec's train_op is the global step's increment alone) serves
    # both precisions (bfloat16 keeps float32 master weights).
    def train_fn(features, labels, mode, params):
      del labels, params
      tf.compat.v1.layers.dense(
          features, CLASSES,
          kernel_initializer=tf.constant_initializer(KERNEL), name='logits')
      step = tf.compat.v1.train.get_or_create_global_step()
      return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
          mode, loss=tf.constant(0.0), train_op=step.assign_add(1))

    eb.make_tpu_estimator(
        train_fn, model_dir=cls.model_dir, precision='float32',
        train_batch_size=BATCH).train(input_fn, max_steps=1)
    for form, precision in ((OPS, 'bfloat16'), (FN, 'bfloat16'),
                            (FN, 'float32')):
      cls.results[form, precision] = estimator(form, precision).evaluate(
          input_fn, steps=1, name='%s_%s' % (form, precision))

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.model_dir, ignore_errors=True)
    super().tearDownClass()

  def test_evaluate_gives_the_graph_values(self):
    for (form, precision), results in self.results.items():
      _, values, _, _, _ = _graph(form if precision == 'bfloat16' else OPS,
                                  precision)
      for name in _ESTIMATOR_ROWS:
        self.assertAllClose(results[name], values[name], rtol=1e-5,
                            msg='%s %s %s' % (name, form, precision))

  def test_metric_fn_got_float32(self):
    # Both precisions' metric_fns ran, each with float32 tensors.
    self.assertLen(self.seen, 2)
    self.assertEqual(set(self.seen), {(tf.float32, tf.float32)})

  def test_bfloat16_within_rounding_of_float32(self):
    for form in (OPS, FN):
      for name in _ESTIMATOR_ROWS:
        self.assertAllClose(self.results[form, 'bfloat16'][name],
                            self.results[FN, 'float32'][name], rtol=2e-2,
                            atol=2e-3)


if __name__ == '__main__':
  tf.test.main()
