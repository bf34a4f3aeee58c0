"""Optimizer slot bytes: what each optimizer keeps for a set of variables.

`eb.memory_plan` plans the model_fn's own optimizer; `check` also plans the
program's step under Adam and Adafactor (`optimizer_plan`), whose slots are
counted here from the trainable variables' shapes. All slots are float32.
"""

import dataclasses

import numpy as np

_FLOAT32_BYTES = 4


def _size(shape):
  return int(np.prod(shape))


def adam_slot_bytes(variable_shapes):
  """Adam keeps two float32 slots (m, v) the size of every parameter.

  Args:
    variable_shapes: iterable of (name, shape), shape a list of ints.
  """
  return sum(2 * _FLOAT32_BYTES * _size(shape) for _, shape in variable_shapes)


def adafactor_slot_bytes(variable_shapes):
  """`eb.AdafactorOptimizer`'s default slots (beta1=0, factored), float32.

  A variable of rank >= 2 keeps a row accumulator (its shape without the
  last dimension) and a column one (without the second to last); vectors
  and scalars keep one accumulator of their own size.
  """
  total = 0
  for _, shape in variable_shapes:
    shape = list(shape)
    if len(shape) >= 2:
      total += _size(shape[:-1]) + _size(shape[:-2] + shape[-1:])
    else:
      total += _size(shape)
  return _FLOAT32_BYTES * total


SLOT_BYTES = {'adam': adam_slot_bytes, 'adafactor': adafactor_slot_bytes}


def slot_bytes(optimizer, variable_shapes):
  """The slot bytes of `optimizer` (a key of `SLOT_BYTES`).

  Raises:
    ValueError: an optimizer without a slot count, listing the choices.
  """
  if optimizer not in SLOT_BYTES:
    raise ValueError('No slot count for optimizer %r; choose one of %s.' %
                     (optimizer, ', '.join(SLOT_BYTES)))
  return SLOT_BYTES[optimizer](variable_shapes)


def optimizer_plan(plan, optimizer, variable_shapes):
  """`plan` (a `MemoryPlan`) with `optimizer`'s slots in place of its own.

  The transient part (activations, gradients, bfloat16 weight copies)
  stays the plan's. With gradient accumulation (K > 1) the accumulators,
  one float32 copy of the trainable variables, count as slots too.
  """
  accumulators = (plan.parameter_bytes
                  if plan.gradient_accumulation_steps > 1 else 0)
  return dataclasses.replace(
      plan, optimizer=optimizer,
      slot_bytes=slot_bytes(optimizer, variable_shapes) + accumulators)
