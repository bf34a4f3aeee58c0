r"""Where a training step's time goes: float32, ours and TensorFlow's rewrite.

    python -m benchmarks.profile --model=bert_mini_seq128 --out=prof.json

Builds one benchmark model (a `configs.find_model` name) in each
variant, runs a few steps in sessions with TensorFlow's default options,
then traces one step per variant (`FULL_TRACE`, with the partition graphs
that ran, after grappler's rewrites and fusions) and sorts every executed
kernel into: matmul/convolution work, casts (weight reads, gradients,
activations), the optimizer update, and the rest. It prints a table and
writes JSON. Kernel times are summed over both threads of this 2-core
machine and include the tracer's own cost: compare variants, not seconds.
"""

import os

os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# pylint: disable=g-import-not-at-top,wrong-import-position
import argparse
import collections
import json
import re
import statistics

import tensorflow as tf

from benchmarks import configs
from benchmarks import graphs
from estimator_bf16.precision import op_lists
from estimator_bf16.precision import policy
from estimator_bf16.platform.tpu import MiB

VARIANTS = policy.PRECISIONS + (configs.REWRITE,)
_OP_TYPE = re.compile(r'= (\w+)\(')
# A cast of one of these (through READ_THROUGH_OPS) casts a weight.
_WEIGHT_SOURCES = op_lists.VARIABLE_OPS | {op_lists.READ_VARIABLE_OP}
# oneDNN's kernels carry their op's name after a prefix ('_MklCast') and
# fused ones beside other names ('_MklNativeFusedMatMul'): a kernel is
# matmul/conv work when it names one of the audit's matrix-unit op types.
_MATH = re.compile('|'.join(sorted(
    re.escape(op.lstrip('_')) for op in op_lists.MATMUL_CONV_OPS)))
_ONEDNN_PREFIX = '_Mkl'
# Optimizer updates: the fused Apply kernels and the ops of BERT's AdamW
# (estimator_bf16/optimizers/adamw.py), which builds its update from plain ops in its scope.
_OPTIMIZER = re.compile(r'(^|/)(AdamWeightDecay|Momentum|Adam|Adafactor)'
                        r'(/|_|$)|^Apply|^ResourceApply|/update_')


def _op_type(kernel):
  """The op type an executed kernel runs: `kernel` without oneDNN's prefix."""
  return (kernel[len(_ONEDNN_PREFIX):] if kernel.startswith(_ONEDNN_PREFIX)
          else kernel)


def _executed_graph(run_metadata):
  """{node name: (op type, [input node names])} of what ran."""
  nodes = {}
  for graph in run_metadata.partition_graphs:
    for node in graph.node:
      nodes[node.name] = (node.op, [i.lstrip('^').split(':')[0]
                                    for i in node.input])
  return nodes


def _cast_kind(name, nodes):
  """'weight', 'gradient' or 'activation' for an executed Cast `name`."""
  op_inputs = nodes.get(name, (None, []))[1]
  seen = set()
  # Through Identity/Enter: a weight read may be forwarded before its cast.
  while op_inputs:
    source = op_inputs[0]
    if source in seen:
      break
    seen.add(source)
    op = _op_type(nodes.get(source, ('', []))[0])
    if op in _WEIGHT_SOURCES:
      return 'weight'
    if op not in op_lists.READ_THROUGH_OPS:
      break
    op_inputs = nodes.get(source, ('', []))[1]
  return 'gradient' if 'gradients' in name else 'activation'


def profile_step(session, train_op, steps=3, traces=3):
  """Runs `steps` untimed steps, then traces `traces`; returns the breakdown.

  Kernel times of one traced step swing by tens of percent on a shared
  machine; each category's time is the median over the traced steps. Counts
  and bytes are the same in every step.

  Returns:
    dict: 'micros' by category ('matmul_conv', 'cast_weight',
    'cast_gradient', 'cast_activation', 'optimizer', 'other'), 'casts'
    and 'cast_bytes' by the same cast kinds, 'op_types' ({type: [count,
    micros]}), and 'fused_ops' (the fused kernels that ran: grappler's
    remapper and oneDNN's fusions).
  """
  for _ in range(steps):
    session.run(train_op)
  breakdowns = []
  for _ in range(traces):
    metadata = tf.compat.v1.RunMetadata()
    session.run(train_op, options=tf.compat.v1.RunOptions(
        trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
        output_partition_graphs=True), run_metadata=metadata)
    breakdowns.append(_breakdown(metadata))
  result = breakdowns[-1]
  for key in ('micros',):
    result[key] = {
        category: statistics.median(b[key].get(category, 0)
                                    for b in breakdowns)
        for category in result[key]}
  result['total_micros'] = statistics.median(b['total_micros']
                                             for b in breakdowns)
  return result


def _breakdown(metadata):
  """The categories of `profile_step` for one traced step."""
  nodes = _executed_graph(metadata)
  micros = collections.Counter()
  casts, cast_bytes = collections.Counter(), collections.Counter()
  op_types = collections.defaultdict(lambda: [0, 0])
  for device in metadata.step_stats.dev_stats:
    for node in device.node_stats:
      match = _OP_TYPE.search(node.timeline_label)
      if not match:
        continue
      kind, took = match.group(1), node.all_end_rel_micros
      op_types[kind][0] += 1
      op_types[kind][1] += took
      if _op_type(kind) == 'Cast':
        category = 'cast_' + _cast_kind(node.node_name, nodes)
        casts[category] += 1
        cast_bytes[category] += sum(
            o.tensor_description.allocation_description.requested_bytes
            for o in node.output)
      elif _OPTIMIZER.search(node.node_name) or _OPTIMIZER.search(kind):
        category = 'optimizer'
      elif _MATH.search(kind):
        category = 'matmul_conv'
      else:
        category = 'other'
      micros[category] += took
  return {'micros': dict(micros), 'total_micros': sum(micros.values()),
          'casts': dict(casts), 'cast_bytes': dict(cast_bytes),
          'op_types': {k: v for k, v in sorted(
              op_types.items(), key=lambda item: -item[1][1])},
          'fused_ops': sorted(k for k in op_types if 'Fused' in k)}


def profile_model(spec):
  """`profile_step` of every variant of `spec`; the float32 graph twice."""
  steps = {p: graphs.build_train_step(spec, p, spec.batch_size)
           for p in policy.PRECISIONS}
  results = {}
  for variant in VARIANTS:
    step = steps['float32' if variant == configs.REWRITE else variant]
    config = (graphs.onednn_rewrite_config()
              if variant == configs.REWRITE else None)
    session = graphs.start_session(step, config)
    try:
      results[variant] = profile_step(session, step.train_op)
    finally:
      session.close()
  return results


def table(name, results):
  """Markdown lines: one row per variant."""
  categories = ('matmul_conv', 'cast_weight', 'cast_gradient',
                'cast_activation', 'optimizer', 'other')
  lines = ['%s (kernel ms per step, summed over threads; casts run '
           '(MiB written))' % name, '',
           '| variant | total | ' + ' | '.join(categories) + ' |',
           '|---|' + '---:|' * (len(categories) + 1)]
  for variant, r in results.items():
    cells = []
    for category in categories:
      cell = '%.0f' % (r['micros'].get(category, 0) / 1e3)
      if category.startswith('cast_'):
        cell += ' (%d, %.1f)' % (r['casts'].get(category, 0),
                                 r['cast_bytes'].get(category, 0) / MiB)
      cells.append(cell)
    lines.append('| %s | %.0f | %s |' % (variant, r['total_micros'] / 1e3,
                                         ' | '.join(cells)))
  lines.append('')
  for variant, r in results.items():
    lines.append('- %s fused kernels: %s; top op types (ms): %s' % (
        variant, ', '.join(r['fused_ops']) or 'none',
        ', '.join('%s %.0f' % (k, v[1] / 1e3)
                  for k, v in list(r['op_types'].items())[:6])))
  return lines


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model', action='append', required=True,
                      help='A benchmark model name (benchmarks.configs.'
                      'find_model), e.g. bert_mini_seq128; repeatable.')
  parser.add_argument('--out', help='JSON file to write.')
  args = parser.parse_args()
  tf.get_logger().setLevel('ERROR')
  everything = {}
  for name in args.model:
    everything[name] = profile_model(configs.find_model(name))
    print('\n'.join(table(name, everything[name])) + '\n', flush=True)
  if args.out:
    with open(args.out, 'w') as out:
      json.dump(everything, out, indent=2, sort_keys=True)


if __name__ == '__main__':
  main()
