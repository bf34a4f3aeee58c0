"""Where the batch is in a feature or label: the rule, and the spec it marks.

Most input pipelines put the batch first, `[N, H, W, C]`, but not all:
tensorflow/tpu's image models feed `[H, W, C, N]` (`transpose_input`, their
default: the model_fn transposes back on the TPU, where that layout is
cheaper to infeed; the current resnet, mnasnet and efficientnet input_fns
also flatten it to `[H * W * C * N]`), and time-major text models feed
`[T, N]`. The memory planner builds its placeholders at batch sizes of its
own, so it must know, for each feature and label, which dimension to
resize.

`batch_axis` and `is_flattened_batch` are the rule, applied where the
input's real shapes (with the real batch) are known (`example_specs`).
`ExampleSpec` is the result: one example's shape and dtype, plus where the
batch goes back in. A plain `tf.TensorSpec` of one example is read as
`ExampleSpec(..., batch_axis=0)`.
"""

import dataclasses

import tensorflow as tf


def batch_axis(shape, batch_size):
  """Returns the dimension of a batched shape that holds the batch.

  The batch dimension is the one whose size is `batch_size`. When several
  are, dimension 0 wins (the common layout), then the last matching one
  (batch-last layouts such as HWCN). When none is, or the batch size is
  unknown, it is dimension 0, as for any `[N, ...]` input.

  Args:
    shape: `tf.TensorShape` (or list) of a whole batch, rank >= 1; unknown
      dimensions never match.
    batch_size: int examples per batch (per core), or None if unknown.

  Returns:
    int, a dimension index in [0, rank).

  Raises:
    ValueError: the shape has unknown rank or rank 0 (no batch to find).
  """
  dims = tf.TensorShape(shape)
  if dims.rank is None or dims.rank == 0:
    raise ValueError('a batched tensor needs a known rank >= 1 to find its '
                     'batch dimension; got shape %s.' % dims)
  if batch_size is None:
    return 0
  matches = [i for i, size in enumerate(dims.as_list()) if size == batch_size]
  if not matches or matches[0] == 0:
    return 0
  return matches[-1]


def is_flattened_batch(shape, batch_size):
  """True for a vector holding a whole batch flattened (`[H * W * C * N]`).

  Only a vector with no dimension of size `batch_size` whose length is a
  multiple of it (more than once) qualifies. `example_specs` also requires
  another tensor of the batch to show the batch size, so that an input_fn
  that ignores `params['batch_size']` keeps its vectors as `[N]`.
  """
  dims = tf.TensorShape(shape)
  if dims.rank != 1 or not batch_size or dims[0] is None:
    return False
  size = dims[0]
  return size != batch_size and size % batch_size == 0


@dataclasses.dataclass(frozen=True)
class ExampleSpec:
  """One example's shape and dtype, and where its batch dimension goes.

  Reads like a `tf.TensorSpec` of one example (`shape`, `dtype`) for code
  that only looks at those.

  Attributes:
    shape: `tf.TensorShape` of one example (the batch dimension removed;
      with `flattened`, the vector's length per example).
    dtype: `tf.DType`.
    batch_axis: int index of the batch dimension in the batched shape, in
      [0, rank of `shape`]; 0 for `[N, ...]`, `shape.rank` for batch-last.
    flattened: the batch is multiplied into dimension `batch_axis` instead
      of being a dimension of its own (a flattened batch, `[L * N]`).
  """
  shape: tf.TensorShape
  dtype: tf.DType
  batch_axis: int = 0
  flattened: bool = False

  def __post_init__(self):
    # Frozen: normalise through object.__setattr__, once, at construction.
    object.__setattr__(self, 'shape', tf.TensorShape(self.shape))
    object.__setattr__(self, 'dtype', tf.as_dtype(self.dtype))
    rank = self.shape.rank
    last = rank - 1 if self.flattened else rank
    if rank is None or not 0 <= self.batch_axis <= last:
      raise ValueError('batch_axis %d is outside the batched shape of an '
                       'example of shape %s.' % (self.batch_axis, self.shape))

  @classmethod
  def of_batch(cls, shape, dtype, batch_size, flattened=False):
    """The spec of one example of a batch of `shape`.

    Args:
      shape: `tf.TensorShape` of the whole batch.
      dtype: its `tf.DType`.
      batch_size: int examples per batch, or None if unknown.
      flattened: the batch is flattened into this vector
        (`is_flattened_batch`).
    """
    dims = tf.TensorShape(shape)
    if flattened:
      return cls([dims[0] // batch_size], dtype, 0, flattened=True)
    axis = batch_axis(dims, batch_size)
    example = dims[:axis].concatenate(dims[axis + 1:])
    return cls(example, dtype, axis)

  def batched_shape(self, batch_size):
    """list: the shape of a batch of `batch_size` such examples."""
    dims = self.shape.as_list()
    if self.flattened:
      dims[self.batch_axis] *= batch_size
      return dims
    return dims[:self.batch_axis] + [batch_size] + dims[self.batch_axis:]


def as_example_spec(spec):
  """An `ExampleSpec` for `spec`; a `tf.TensorSpec` has its batch first."""
  if isinstance(spec, ExampleSpec):
    return spec
  if isinstance(spec, tf.TensorSpec):
    return ExampleSpec(spec.shape, spec.dtype, 0)
  raise TypeError('the memory planner needs a tf.TensorSpec or ExampleSpec '
                  'of one example; got %r.' % (spec,))


def example_specs(batch, batch_size):
  """`ExampleSpec`s for a nest of batched tensors or specs.

  Give features and labels together, `(features, labels)`: a flattened
  batch is recognised only when another tensor of the nest has a dimension
  of `batch_size` (see `is_flattened_batch`).

  Args:
    batch: nest of `tf.Tensor` or `tf.TensorSpec` with the batch in their
      shapes, as an input_fn yields them; None entries stay None.
    batch_size: int examples per batch (`params['batch_size']`), or None.

  Returns:
    The same nest, of `ExampleSpec`.

  Raises:
    TypeError: an element is not dense (e.g. a `tf.SparseTensor`) or has
      no batch dimension (unknown rank, or a scalar).
  """
  items = [item for item in tf.nest.flatten(batch) if item is not None]
  for item in items:
    if not isinstance(item, (tf.Tensor, tf.TensorSpec)):
      raise TypeError('the memory plan needs dense features; got %r' %
                      (item,))
    if not item.shape.rank:
      raise TypeError('the memory plan needs a batch dimension in every '
                      'feature and label; got shape %s' % item.shape)
  shown = batch_size is not None and any(
      batch_size in item.shape.as_list() for item in items)

  def spec_of(item):
    if item is None:
      return None
    flattened = shown and is_flattened_batch(item.shape, batch_size)
    return ExampleSpec.of_batch(item.shape, item.dtype, batch_size, flattened)
  return tf.nest.map_structure(spec_of, batch)


def labels_batch_size(labels):
  """The batch size the labels show, or None.

  A plain Estimator passes its model_fn no `params['batch_size']`; its
  labels (`[N]`, `[N, classes]`, ...) still have the batch first, where
  the features may not (tensorflow/tpu's amoeba_net feeds HWCN images to
  a plain Estimator off the TPU).

  Args:
    labels: nest of `tf.Tensor` / `tf.TensorSpec`, or None.

  Returns:
    int, the first dimension every label with one shares statically, or
    None (no labels, scalars only, unknown or disagreeing sizes).
  """
  sizes = set()
  for item in tf.nest.flatten(labels):
    if item is None or not item.shape.rank:
      continue
    sizes.add(item.shape.as_list()[0])
  if len(sizes) == 1 and None not in sizes:
    return sizes.pop()
  return None


def static_batch_size(batch, batch_size):
  """The static batch size of a nest of batched tensors, if it has one.

  Args:
    batch: nest of `tf.Tensor` or `tf.TensorSpec` with the batch in their
      shapes.
    batch_size: int examples per batch, or None.

  Returns:
    `batch_size` when some tensor has a dimension of that size; else the
    first dimension of the first tensor of rank >= 1 (int or None); None
    when there is none.
  """
  shapes = [item.shape for item in tf.nest.flatten(batch)
            if getattr(item, 'shape', None) is not None and item.shape.rank]
  if batch_size is not None and any(batch_size in shape.as_list()
                                    for shape in shapes):
    return batch_size
  return shapes[0].as_list()[0] if shapes else None
