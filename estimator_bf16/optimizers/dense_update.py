"""A base class for optimizers written as one dense update rule."""

import contextlib

import tensorflow as tf


@contextlib.contextmanager
def after(grad):
  """Ops built inside (variable and slot reads too) wait for `grad`.

  A read of a variable or a slot has no data input, so the executor runs it,
  and products of it such as `beta1 * m`, as soon as the step starts; they
  are then held through the whole backward pass, a full-size float32 copy
  per variable (for an embedding table, tens of MiB at the step's peak).
  Reads made inside this block with `tf.identity` (a new read, which a
  variable's cached snapshot is not) run once the gradient exists.

  Args:
    grad: the gradient tensor the update is built from.

  Yields:
    None.
  """
  with tf.control_dependencies([grad]):
    yield


class DenseUpdateOptimizer(tf.compat.v1.train.Optimizer):
  """Routes every gradient kind to `_update(grad, var)` with a dense grad.

  Subclasses implement `_update(grad, var) -> op`, where `grad` is a dense
  float tensor shaped like `var` and `var` is the (ref or resource) variable
  that `get_slot` is keyed on.

  Sparse (embedding) gradients are made dense: optimizers with decaying
  statistics or weight decay change every row anyway, so a sparse update
  would not be cheaper, and the dense rule is the algorithm as written.
  """

  def _update(self, grad, var):
    raise NotImplementedError('subclasses define the update rule')

  def _apply_dense(self, grad, var):
    return self._update(grad, var)

  def _resource_apply_dense(self, grad, handle):
    # The v1 Optimizer passes the ResourceVariable itself as `handle`, which
    # is what get_slot() is keyed on.
    return self._update(grad, handle)

  def _apply_sparse_duplicate_indices(self, grad, var):
    return self._update(tf.convert_to_tensor(grad), var)

  def _apply_sparse(self, grad, var):
    return self._update(tf.convert_to_tensor(grad), var)

  def _resource_apply_sparse_duplicate_indices(self, grad, handle, indices):
    return self._resource_apply_sparse(grad, handle, indices)

  def _resource_apply_sparse(self, grad, handle, indices):
    # unsorted_segment_sum adds up repeated indices, as the dense gradient
    # of a gather with repeated ids would.
    dense = tf.math.unsorted_segment_sum(
        grad, indices, num_segments=handle.shape[0])
    return self._update(dense, handle)
