"""Every callable form of model_fn and input_fn keeps its calling contract.

One row per form (issue 45): a plain function, `functools.partial`
(positional, keyword-bound, a partial of a partial), a bound method, an
object with `__call__`, a lambda, defaults and `**kwargs`, and a
`functools.wraps` decorator. The bfloat16 input_fn wrapper must offer the
Estimator's argument rule exactly what the original offers (TensorFlow
2.15's `function_utils.fn_args` on the real tf.estimator, the compat
backend's `calling.arg_names` on 2.16+), and one training step through the
backend's Estimator must work with both wrappers. A keyword-bound partial
input_fn broke the real TPUEstimator: `wrap_input_fn` copied the partial's
`inspect.signature`, where `params` is keyword-only.
"""

import functools
import tempfile

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.compat import calling

_DATA = (np.arange(32, dtype=np.float32).reshape(8, 4) / 32,
         np.array([0, 1] * 4, np.int32))


def _offered(fn):
  """The names the backend's Estimator passes `fn`, by its own rule."""
  if eb.BACKEND == 'tf_estimator':
    from tensorflow.python.util import function_utils  # pylint: disable=g-import-not-at-top
    return set(function_utils.fn_args(fn))
  return set(calling.arg_names(fn, 'fn'))


def _dataset(data, batch):
  return tf.data.Dataset.from_tensor_slices(data).repeat().batch(
      batch, drop_remainder=True)


def _network(features, labels, mode, hidden=4):
  net = tf.compat.v1.layers.dense(features, hidden, tf.nn.relu, name='hidden')
  logits = tf.compat.v1.layers.dense(net, 2, name='logits')
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, tf.compat.v1.train.get_or_create_global_step())
  return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
      mode, loss=loss, train_op=train_op)


# input_fn forms.
def _input_plain(params):
  return _dataset(_DATA, params['batch_size'])


def _input_data_first(data, params):
  return _dataset(data, params['batch_size'])


def _input_nested(data, scale, params):
  return _dataset((data[0] * scale, data[1]), params['batch_size'])


def _input_defaults(params, scale=1.0, **kwargs):
  del kwargs
  return _dataset((_DATA[0] * scale, _DATA[1]), params['batch_size'])


def _decorated(fn):
  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    return fn(*args, **kwargs)
  return wrapper


@_decorated
def _input_decorated(params=None):
  return _dataset(_DATA, (params or {}).get('batch_size', 4))


class _Pipeline:

  def input_fn(self, params):
    return _dataset(_DATA, params['batch_size'])

  def __call__(self, params):
    return _dataset(_DATA, params['batch_size'])


# model_fn forms.
def _model_plain(features, labels, mode, params):
  del params
  return _network(features, labels, mode)


def _model_hidden_first(hidden, features, labels, mode):
  return _network(features, labels, mode, hidden)


def _model_nested(hidden, scale, features, labels, mode):
  return _network(features * scale, labels, mode, hidden)


def _model_defaults(features, labels, mode, params=None, **kwargs):
  del params, kwargs
  return _network(features, labels, mode)


class _Model:

  def model_fn(self, features, labels, mode):
    return _network(features, labels, mode)

  def __call__(self, features, labels, mode, config):
    del config
    return _network(features, labels, mode)


def _model_decorated():
  @functools.wraps(_model_plain)
  def model_fn(features, labels, mode, params):
    return _model_plain(features, labels, mode, params)
  return model_fn


_FORMS = (
    ('plain', _input_plain, _model_plain),
    ('partial_positional', functools.partial(_input_data_first, _DATA),
     functools.partial(_model_hidden_first, 4)),
    ('partial_keyword', functools.partial(_input_data_first, data=_DATA),
     functools.partial(_model_hidden_first, hidden=4)),
    ('partial_of_partial', functools.partial(
        functools.partial(_input_nested, data=_DATA), scale=1.0),
     functools.partial(functools.partial(_model_nested, 4), scale=1.0)),
    ('bound_method', _Pipeline().input_fn, _Model().model_fn),
    ('callable_object', _Pipeline(), _Model()),
    ('lambda', lambda params: _dataset(_DATA, params['batch_size']),
     lambda features, labels, mode: _network(features, labels, mode)),
    ('defaults_and_kwargs', _input_defaults, _model_defaults),
    ('functools_wraps', _input_decorated, _model_decorated()),
)


@pytest.mark.slow
class CallableFormsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*_FORMS)
  def test_input_fn_wrapper_offers_what_the_original_offers(
      self, input_fn, model_fn):
    del model_fn
    wrapped = eb.wrap_input_fn(input_fn, 'bfloat16')
    self.assertEqual(_offered(wrapped), _offered(input_fn))
    self.assertEqual(calling.input_fn_kwargs(wrapped, params={}).keys(),
                     calling.input_fn_kwargs(input_fn, params={}).keys())

  @parameterized.named_parameters(*_FORMS)
  def test_one_train_step_through_the_tpu_estimator(self, input_fn,
                                                    model_fn):
    if 'params' not in _offered(input_fn):
      # TPUEstimator passes the batch size in params; tf.estimator 2.15
      # reads no names behind a (*args, **kwargs) decorator.
      self.skipTest('TPUEstimator refuses this input_fn unwrapped too')
    estimator = tf.compat.v1.estimator.tpu.TPUEstimator(
        model_fn=eb.wrap_model_fn(model_fn, 'bfloat16'),
        config=tf.compat.v1.estimator.tpu.RunConfig(
            model_dir=tempfile.mkdtemp(dir=self.get_temp_dir()),
            log_step_count_steps=None),
        use_tpu=False, train_batch_size=4)
    estimator.train(eb.wrap_input_fn(input_fn, 'bfloat16'), steps=1)
    self.assertEqual(estimator.get_variable_value('global_step'), 1)


if __name__ == '__main__':
  tf.test.main()
