"""Summaries of bfloat16 tensors, one row each, under bfloat16 (issue 45).

A one-layer TRAIN model_fn (wrapped with `eb.wrap_model_fn(..., 'bfloat16')`,
strict audit) writes each summary from the bfloat16 layer's results:
`tf.compat.v1.summary.scalar/histogram/image/audio/text/tensor_summary`,
and TF2 `tf.summary.scalar/histogram/write` to a writer the model_fn
creates. Each row asserts that the summary op reads float32 where it reads
floats, that the recorded values are float32 where the summary holds a
tensor, and that they are within bfloat16 rounding of the float32 build's.
All rows share one graph per precision. A real
`make_tpu_estimator(...).train` of two steps then writes v1 summaries and a
`host_call`'s TF2 summaries of bfloat16 tensors, read from the event files.
"""

import glob
import os
import shutil
import tempfile

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import estimator_bf16 as eb

S = tf.compat.v1.summary
V2 = tf.compat.v2.summary
CLASSES = 5
UNITS = 12
BATCH = 8
SAMPLE_RATE = 8000
_RNG = np.random.RandomState(46)
FEATURES = _RNG.randn(BATCH, 6).astype(np.float32)
HIDDEN = (_RNG.randn(6, UNITS) * 0.5).astype(np.float32)
KERNEL = (_RNG.randn(UNITS, CLASSES) * 0.5).astype(np.float32)
LABELS = _RNG.randint(0, CLASSES, BATCH).astype(np.int32)
# The summary's v1 op types that take a floating tensor, by row.
_V1_ROWS = {
    'scalar': ('ScalarSummary', lambda n: S.scalar('scalar', n['logits'][0,
                                                                        0])),
    'scalar_of_softmax': ('ScalarSummary', lambda n: S.scalar(
        'scalar_of_softmax', n['probs'][0, 1])),
    'histogram': ('HistogramSummary', lambda n: S.histogram(
        'histogram', n['hidden'])),
    'image': ('ImageSummary', lambda n: S.image(
        'image', tf.reshape(tf.nn.sigmoid(n['hidden']), [BATCH, 3, 4, 1]),
        max_outputs=2)),
    'audio': ('AudioSummaryV2', lambda n: S.audio(
        'audio', tf.tanh(n['hidden']), SAMPLE_RATE, max_outputs=2)),
    'text': ('TensorSummaryV2', lambda n: S.text(
        'text', tf.strings.as_string(n['hidden'][0, :4], precision=6))),
    'tensor_summary': ('TensorSummaryV2', lambda n: S.tensor_summary(
        'tensor_summary', n['hidden'])),
}
_V2_ROWS = {
    'v2_scalar': lambda n, step: V2.scalar('v2_scalar', n['logits'][0, 0],
                                           step=step),
    'v2_histogram': lambda n, step: V2.histogram('v2_histogram', n['hidden'],
                                                 step=step),
    'v2_write': lambda n, step: V2.write('v2_write', n['hidden'], step=step),
}


def setUpModule():
  tf.compat.v1.disable_eager_execution()


def _network(features):
  hidden = tf.compat.v1.layers.dense(
      features, UNITS, tf.nn.relu,
      kernel_initializer=tf.constant_initializer(HIDDEN), name='hidden')
  logits = tf.compat.v1.layers.dense(
      hidden, CLASSES, kernel_initializer=tf.constant_initializer(KERNEL),
      name='logits')
  return {'hidden': hidden, 'logits': logits, 'probs': tf.nn.softmax(logits)}


def _train_op(loss):
  return tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, tf.compat.v1.train.get_or_create_global_step())


def _build_and_run(precision, logdir):
  """Builds every row in one TRAIN graph and runs it once.

  Returns:
    ({row: v1 summary proto}, {tag: (tensor dtype, value)} of the TF2
    events, {row: the summary op}, the network's dtype, {row: the error
    its build raised}).
  """
  built = {}

  def model_fn(features, labels, mode):
    network = _network(features)
    built['dtype'] = network['logits'].dtype
    built['v1'], built['errors'] = {}, {}
    for row, (_, make) in _V1_ROWS.items():
      try:
        built['v1'][row] = make(network)
      except Exception as error:  # pylint: disable=broad-except
        # The row's own test reports it; the other rows still build.
        built['errors'][row] = error
    step = tf.compat.v1.train.get_or_create_global_step()
    # A TF2 writer inside the model_fn, as TF2-style code in a TF1
    # model_fn writes.
    writer = V2.create_file_writer(logdir)
    with writer.as_default(), V2.record_if(True):
      for make in _V2_ROWS.values():
        make(network, step)
    built['v2'] = tf.compat.v1.summary.all_v2_summary_ops()
    built['writer'] = writer
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
        labels, network['logits'])
    return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
        mode, loss=loss, train_op=_train_op(loss))

  with tf.Graph().as_default():
    eb.wrap_model_fn(model_fn, precision)(
        tf.constant(FEATURES), tf.constant(LABELS), 'train')
    with tf.compat.v1.Session() as sess:
      sess.run([tf.compat.v1.global_variables_initializer(),
                built['writer'].init()])
      v1, _ = sess.run([built['v1'], built['v2']])
      sess.run(built['writer'].flush())
  ops = {row: tensor.op for row, tensor in built['v1'].items()}
  return ({row: tf.compat.v1.Summary.FromString(value).value[0]
           for row, value in v1.items()}, _v2_events(logdir), ops,
          built['dtype'], built['errors'])


def _v2_events(logdir):
  """{tag: (dtype, array)} of the tensor summaries under `logdir`."""
  events = {}
  for path in glob.glob(os.path.join(logdir, '**', 'events*'),
                        recursive=True):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.HasField('tensor'):
          array = tf.make_ndarray(value.tensor)
          events[value.tag] = (tf.as_dtype(value.tensor.dtype), array)
  return events


class SummaryTableTest(tf.test.TestCase, parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.logdir = tempfile.mkdtemp(prefix='summary_table_')
    cls.builds = {precision: _build_and_run(
        precision, os.path.join(cls.logdir, precision))
                  for precision in ('bfloat16', 'float32')}

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.logdir, ignore_errors=True)
    super().tearDownClass()

  def _values(self, row):
    error = self.builds['bfloat16'][4].get(row)
    if error is not None:
      raise error
    return [self.builds[p][0][row] for p in ('bfloat16', 'float32')]

  def test_network_is_bfloat16(self):
    self.assertEqual(self.builds['bfloat16'][3], tf.bfloat16)
    self.assertEqual(self.builds['float32'][3], tf.float32)

  @parameterized.named_parameters((row, row) for row in sorted(_V1_ROWS))
  def test_v1_summary_reads_float32(self, row):
    self._values(row)
    op = self.builds['bfloat16'][2][row]
    self.assertEqual(op.type, _V1_ROWS[row][0])
    floats = [t.dtype for t in op.inputs if t.dtype.is_floating]
    if row != 'text':  # A text summary reads strings.
      self.assertNotEmpty(floats)
    self.assertEqual(set(floats) - {tf.float32}, set())

  def test_v1_scalars(self):
    for row in ('scalar', 'scalar_of_softmax'):
      got, want = self._values(row)
      # A slice of the softmax is its bfloat16 rounding (autocast keeps the
      # float32 value of the whole softmax only).
      self.assertAllClose(got.simple_value, want.simple_value, rtol=2e-2)

  def test_v1_histogram(self):
    got, want = self._values('histogram')
    self.assertEqual(got.histo.num, want.histo.num)
    self.assertAllClose([got.histo.min, got.histo.max, got.histo.sum],
                        [want.histo.min, want.histo.max, want.histo.sum],
                        rtol=2e-2, atol=2e-3)

  def test_v1_image(self):
    # Fails to build on the old code: the image summary has no bfloat16
    # kernel, and autocast left its input bfloat16.
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
      got, want = sess.run([
          tf.image.decode_png(v.image.encoded_image_string)
          for v in self._values('image')])
    self.assertEqual(got.shape, (3, 4, 1))
    self.assertAllClose(got.astype(int), want.astype(int), atol=3)

  def test_v1_audio(self):
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
      got, want = sess.run([
          tf.audio.decode_wav(v.audio.encoded_audio_string).audio
          for v in self._values('audio')])
    self.assertEqual(got.shape, (UNITS, 1))
    self.assertAllClose(got, want, rtol=2e-2, atol=2e-3)

  def test_v1_text(self):
    got, want = [tf.make_ndarray(v.tensor) for v in self._values('text')]
    self.assertAllClose(got.astype(np.float32), want.astype(np.float32),
                        rtol=2e-2, atol=2e-3)

  def test_v1_tensor_summary_holds_float32(self):
    # On the old code it held the bfloat16 tensor.
    got, want = [v.tensor for v in self._values('tensor_summary')]
    self.assertEqual(tf.as_dtype(got.dtype), tf.float32)
    self.assertAllClose(tf.make_ndarray(got), tf.make_ndarray(want),
                        rtol=2e-2, atol=2e-3)

  @parameterized.named_parameters((tag, tag) for tag in sorted(_V2_ROWS))
  def test_v2_summary_in_model_fn(self, tag):
    (got_dtype, got), (want_dtype, want) = [
        self.builds[p][1][tag] for p in ('bfloat16', 'float32')]
    # float32 as in the float32 build (the histogram's buckets are float64
    # in both); tf.summary.write stored bfloat16 on the old code.
    self.assertEqual(got_dtype, want_dtype)
    self.assertIn(got_dtype, (tf.float32, tf.float64))
    if tag == 'v2_histogram':
      # Bucket edges and the total count: a value on an edge may change
      # bucket with the rounding.
      self.assertEqual(got[:, 2].sum(), want[:, 2].sum())
      got, want = got[:, :2], want[:, :2]
    self.assertAllClose(got, want, rtol=2e-2, atol=2e-3)


class EstimatorSummaryTest(tf.test.TestCase):
  """v1 summaries and a host_call through make_tpu_estimator(...).train."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp(prefix='summary_train_')
    cls.host_dtypes = []
    cls.events = {p: cls._train(p) for p in ('bfloat16', 'float32')}

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  @classmethod
  def _train(cls, precision):
    model_dir = os.path.join(cls.root, precision)
    host_dir = os.path.join(model_dir, 'host')

    def model_fn(features, labels, mode, params):
      del params
      network = _network(features)
      S.scalar('v1_logit', network['logits'][0, 0])
      S.histogram('v1_hidden', network['hidden'])
      loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
          labels, network['logits'])
      step = tf.compat.v1.train.get_or_create_global_step()

      def host_fn(step, logits, probs):
        cls.host_dtypes.append((logits.dtype, probs.dtype))
        writer = V2.create_file_writer(host_dir)
        with writer.as_default(), V2.record_if(True):
          V2.scalar('host_logit', logits[0, 0], step=step[0])
          V2.scalar('host_prob', probs[0, 1], step=step[0])
          return tf.compat.v1.summary.all_v2_summary_ops()

      return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
          mode, loss=loss, train_op=_train_op(loss),
          host_call=(host_fn, [tf.reshape(step, [1]), network['logits'],
                               network['probs']]))

    def input_fn(params):
      del params
      return tf.data.Dataset.from_tensors((FEATURES, LABELS)).repeat()

    eb.make_tpu_estimator(
        model_fn, model_dir=model_dir, precision=precision,
        train_batch_size=BATCH, estimator_options=eb.EstimatorOptions(
            save_summary_steps=1,
            iterations_per_loop=1)).train(input_fn, max_steps=2)
    return {'v1': cls._read(glob.glob(os.path.join(model_dir, 'events*'))),
            'host': cls._read(glob.glob(os.path.join(host_dir, 'events*')))}

  @staticmethod
  def _read(paths):
    """{tag: [(dtype or None, value) in the order written]}."""
    tags = {}
    for path in paths:
      for event in tf.compat.v1.train.summary_iterator(path):
        for value in event.summary.value:
          if value.HasField('tensor'):
            array = tf.make_ndarray(value.tensor)
            entry = (tf.as_dtype(value.tensor.dtype), array)
          elif value.HasField('histo'):
            entry = (None, [value.histo.min, value.histo.max,
                            value.histo.sum])
          else:
            entry = (None, value.simple_value)
          tags.setdefault(value.tag, []).append(entry)
    return tags

  def test_host_fn_got_float32(self):
    self.assertNotEmpty(self.host_dtypes)
    self.assertEqual(set(self.host_dtypes), {(tf.float32, tf.float32)})

  def test_host_call_summaries(self):
    got, want = [self.events[p]['host'] for p in ('bfloat16', 'float32')]
    for tag in ('host_logit', 'host_prob'):
      self.assertLen(got[tag], 2)
      self.assertEqual({dtype for dtype, _ in got[tag]}, {tf.float32})
      self.assertAllClose([v for _, v in got[tag]],
                          [v for _, v in want[tag]], rtol=2e-2, atol=2e-3)

  def test_v1_summaries(self):
    got, want = [self.events[p]['v1'] for p in ('bfloat16', 'float32')]
    for tag in ('v1_logit', 'v1_hidden'):
      self.assertLen(got[tag], 2)
      self.assertAllClose([v for _, v in got[tag]],
                          [v for _, v in want[tag]], rtol=2e-2, atol=2e-3)


if __name__ == '__main__':
  tf.test.main()
