"""Measured memory of a training step, and the largest batch within a budget.

The peak is the CPU allocator's, read with the package's own instrument
(`estimator_bf16.memory.peak.peak_bytes_from_run_metadata` on a FULL_TRACE step).
The allocator is shared by the whole process, so a measurement runs with
no other session alive and subtracts what was in use before its session
started; it also reads the bytes in use between two steps, which are the
persistent part (variables and optimizer slots).

Both need `TF_CPU_ALLOCATOR_USE_BFC=true` in the environment before
TensorFlow is imported (see `estimator_bf16/memory/peak.py`).
"""

import collections
import math
import re

import tensorflow as tf

from estimator_bf16.memory import peak as peak_lib
from estimator_bf16.memory import plan_build
from benchmarks import graphs


def bytes_in_use():
  """Bytes the process's CPU allocator holds now (int)."""
  return int(tf.config.experimental.get_memory_info('CPU:0')['current'])


def check_allocator_stats():
  """Raises if the CPU allocator keeps no statistics (the env var is unset)."""
  if not peak_lib.allocator_stats_enabled():
    raise RuntimeError(
        'Memory benchmarks need %s=%s in the environment before TensorFlow '
        'is imported; scripts/benchmark.py sets it first thing.' %
        peak_lib.ALLOCATOR_ENV)


def measure_step_memory(step, session_config=None):
  """Measures one training step's peak and its persistent part.

  Args:
    step: a `graphs.TrainStep`; no other session may be alive.
    session_config: a `ConfigProto` to start from (e.g. with TensorFlow's
      bfloat16 rewrite on); `graphs.memory_session_config`'s options are
      applied to it.

  Returns:
    dict of ints: 'batch_size'; 'peak_step_bytes' (allocator peak of a
    traced step, after one warm-up step); 'peak_tensor_bytes' (the
    variables plus `peak_lib.live_tensor_peak` of that step); 'persistent_bytes'
    (allocator bytes in use between steps); 'transient_bytes' (allocator
    peak minus persistent: activations, gradients, bfloat16 weight copies,
    kernel temporaries); 'kernel_scratch_bytes' and
    'kernel_scratch_op' (see `kernel_scratch`); and the graph's
    'parameter_bytes', 'slot_bytes' and 'state_bytes' (from its variables;
    state includes the resident input batch); 'executed' (`op_profile` of
    the traced step: what ran after grappler's rewrites).
  """
  check_allocator_stats()
  baseline = bytes_in_use()
  config = graphs.memory_session_config()
  if session_config is not None:
    config.MergeFrom(session_config)
  session = graphs.start_session(step, config)
  try:
    # The first step creates kernels and caches; the second is a step like
    # every later one.
    graphs.run_update(session, step)
    persistent = bytes_in_use() - baseline
    run_metadata = tf.compat.v1.RunMetadata()
    graphs.run_update(session, step,
                      options=peak_lib.traced_run_options(),
                      run_metadata=run_metadata)
    peak = peak_lib.peak_bytes_from_run_metadata(run_metadata) - baseline
  finally:
    session.close()
  scratch, scratch_op = kernel_scratch(run_metadata)
  variables = plan_build.variable_bytes(step.graph)
  tensors = (peak_lib.live_tensor_peak(run_metadata) +
             variables['parameter_bytes'] + variables['slot_bytes'] +
             variables['state_bytes'])
  result = {'batch_size': step.batch_size, 'peak_step_bytes': int(peak),
            'peak_tensor_bytes': int(tensors),
            'persistent_bytes': int(persistent),
            'transient_bytes': int(peak - persistent),
            'kernel_scratch_bytes': scratch, 'kernel_scratch_op': scratch_op}
  result.update(variables)
  result['executed'] = op_profile(run_metadata)
  return result


_OP_TYPE = re.compile(r'= (\w+)\(')


def op_profile(run_metadata):
  """What a traced step executed: op counts, and the casts' cost.

  Grappler rewrites the graph before it runs (TensorFlow's bfloat16 pass
  adds its casts then), so this reads the step stats, not the graph.

  Returns:
    dict: 'ops' (kernels run), 'casts' (Cast kernels run), 'cast_bytes'
    (bytes the casts wrote), 'cast_micros' (their summed run time, over
    both threads' work), 'op_micros' (all kernels' summed run time), and
    'top_ops' ([op type, micros] of the 8 costliest op types).
  """
  micros, casts, cast_bytes, cast_micros, ops = (
      collections.Counter(), 0, 0, 0, 0)
  for device in run_metadata.step_stats.dev_stats:
    for node in device.node_stats:
      match = _OP_TYPE.search(node.timeline_label)
      if not match:
        continue
      kind = match.group(1)
      took = node.all_end_rel_micros
      ops += 1
      micros[kind] += took
      if kind == 'Cast':
        casts += 1
        cast_micros += took
        cast_bytes += sum(
            o.tensor_description.allocation_description.requested_bytes
            for o in node.output)
  return {'ops': ops, 'casts': casts, 'cast_bytes': int(cast_bytes),
          'cast_micros': int(cast_micros),
          'op_micros': int(sum(micros.values())),
          'top_ops': [[k, int(v)] for k, v in micros.most_common(8)]}


def kernel_scratch(run_metadata):
  """The largest temporary memory one kernel allocated beyond its outputs.

  A CPU without bfloat16 arithmetic computes a bfloat16 matmul by
  converting its operands to float32 first, in temporaries the graph never
  shows; this finds the op with the most such bytes in a traced step.

  Returns:
    (bytes, op name): the op's allocator peak minus its outputs' bytes.
  """
  best, name = 0, None
  for device in run_metadata.step_stats.dev_stats:
    for node in device.node_stats:
      peak = max([m.peak_bytes for m in node.memory] or [0])
      outputs = sum(o.tensor_description.allocation_description.requested_bytes
                    for o in node.output)
      if peak - outputs > best:
        best, name = peak - outputs, node.node_name
  return int(best), name


def _next_batch(points, budget, guess, tolerance, slope=None):
  """Picks the next batch to measure, or None when the bracket is tight.

  Args:
    points: {batch: measured peak bytes}.
    budget: bytes.
    guess: where to start when nothing is measured yet.
    tolerance: stop when the smallest failing batch is within this fraction
      of the largest fitting one.
    slope: expected bytes per additional example (e.g. the planner's), used
      to step from the measurement nearest to the budget; without it, a
      secant through the two nearest measurements.
  """
  fits = [b for b, peak in points.items() if peak <= budget]
  fails = [b for b, peak in points.items() if peak > budget]
  low = max(fits) if fits else 0
  high = min(fails) if fails else None
  if high is not None and (high - low <= max(1, tolerance * low)):
    return None
  if fits and high is not None:
    # Bracketed: interpolate between the two ends, but stay inside the
    # middle 80% of the bracket so it always shrinks; the allocator's peak
    # is not smooth in the batch (it rounds chunks up), so a pure secant
    # can stall at one end.
    p_low, p_high = points[low], points[high]
    target = (low + (budget - p_low) * (high - low) / float(p_high - p_low)
              if p_high > p_low else (low + high) / 2.0)
    margin = max(1.0, 0.1 * (high - low))
    return int(round(min(max(target, low + margin), high - margin)))
  nearest = sorted(points.items(), key=lambda item: abs(item[1] - budget))
  if guess and guess not in points and (high is None or guess < high) and (
      guess > low):
    target = guess
  elif slope and nearest:
    # Peak memory grows about linearly in the batch, but the allocator's
    # rounding makes two nearby measurements a poor estimate of the slope.
    (b1, p1) = nearest[0]
    target = b1 + (budget - p1) / float(slope)
  elif len(nearest) >= 2:
    (b1, p1), (b2, p2) = nearest[:2]
    secant = (p2 - p1) / float(b2 - b1)
    target = b1 + (budget - p1) / secant if secant > 0 else 2 * max(points)
  elif nearest:
    (b1, p1) = nearest[0]
    target = b1 * budget / float(p1)
  else:
    target = max(1, guess or 1)
  # Land just inside the budget when no fit is known near the crossing, and
  # just past the largest fit to close the bracket.
  step = max(1, int(math.ceil(tolerance * max(low, 1))))
  batch = int(target)
  if low and batch <= low + step:
    batch = low + step
  if high is not None and batch >= high:
    batch = high - max(1, int(tolerance * high) // 2)
  return max(batch, low + 1, 1)


def max_batch_in_budget(build_step, budget_bytes, *, guess, known=(),
                        slope=None, tolerance=0.08, max_measurements=6):
  """Finds, by measurement, the largest batch whose step peak fits a budget.

  Args:
    build_step: `build_step(batch_size) -> graphs.TrainStep`.
    budget_bytes: the budget, compared with `measure_step_memory`'s peak.
    guess: first batch to try (e.g. the planner's answer).
    known: `measure_step_memory` results to start from.
    slope: expected bytes per example near the answer (see `_next_batch`).
    tolerance: the answer is bracketed to within this fraction.
    max_measurements: stop after this many new measurements.

  Returns:
    dict: 'max_batch' (largest measured batch within the budget, 0 if none),
    'smallest_failing_batch' (or None), 'budget_bytes', 'measurements'
    ([batch, peak bytes] pairs in the order measured, known ones first),
    'peak_at_max_batch' (the allocator's; the budget is the CPU's),
    'tensor_peak_at_max_batch' (live tensors) and 'at_max_batch' (the full
    measurement there).
  """
  details = {m['batch_size']: m for m in known}
  order = list(details)
  for _ in range(max_measurements):
    points = {b: m['peak_step_bytes'] for b, m in details.items()}
    batch = _next_batch(points, budget_bytes, guess, tolerance, slope)
    if batch is None or batch in details:
      break
    details[batch] = measure_step_memory(build_step(batch))
    order.append(batch)
  fits = [b for b in details if details[b]['peak_step_bytes'] <= budget_bytes]
  fails = [b for b in details if details[b]['peak_step_bytes'] > budget_bytes]
  best = max(fits) if fits else 0
  return {'max_batch': best,
          'smallest_failing_batch': min(fails) if fails else None,
          'budget_bytes': int(budget_bytes),
          'peak_at_max_batch': details[best]['peak_step_bytes'] if fits
                               else None,
          'tensor_peak_at_max_batch': (
              details[best].get('peak_tensor_bytes') if fits else None),
          'at_max_batch': details.get(best),
          'measurements': [[int(b), int(details[b]['peak_step_bytes'])]
                           for b in order]}
