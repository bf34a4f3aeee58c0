"""The benchmark machinery on a tiny model: figures, bookkeeping, report.

Runs the real sections (memory, largest batch, planner check, throughput of
float32, ours and TensorFlow's oneDNN rewrite, wrapper overhead per step and
per model_fn call, Keras comparison in its subprocess, Adafactor) on the
MNIST MLP at a small batch, and checks what must hold whatever the speed:
every figure is there, each ratio is the quotient of the numbers it names,
the rewrite really ran (it adds casts at run time), the targets are judged
from those numbers (speed only on a CPU with native bfloat16), and the
results block of docs/benchmarks.md is generated and spliced. No timing is
asserted.
"""

import collections
import copy
import dataclasses
import json
import math
import os
import statistics
import sys

import pytest
import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

from estimator_bf16.memory import peak as peak_lib
from estimator_bf16.platform import tpu as tpu_facts
from estimator_bf16.platform import cpu_bfloat16
from benchmarks import configs
from benchmarks import graphs
from benchmarks import head_to_head
from benchmarks import kernels
from benchmarks import report
from benchmarks import runner
from benchmarks import step_memory
from benchmarks import throughput
from scripts import benchmark as benchmark_program
from scripts import update_readme
from tests.support import paths

MiB = tpu_facts.MiB


def _tiny_config():
  # One model keeps it to seconds; graph building dominates, and BERT or
  # ResNet graphs take seconds each to build.
  models = (configs.ModelSpec('mnist_mlp', 'mnist_mlp', batch_size=64,
                              optimizer='adam', budget_mib=16,
                              memory_batch=256),)
  return configs.BenchmarkConfig(
      mode='quick', models=models, warmup_steps=1,
      window_steps=(('mnist_mlp', 2),), windows=2,
      model_windows=(('mnist_mlp', 3),), memory_rounds=2,
      max_search_measurements=2, overhead_batch_size=32,
      overhead_window_steps=2, overhead_windows=2, build_overhead_calls=2,
      adafactor_model='mnist_mlp', keras_batch_size=64, keras_window_steps=2,
      accumulation_runs=(('mnist_mlp', 256, 4),),
      recompute_runs=(('mnist_mlp', 256),),
      both_levers_run=('mnist_mlp', 512, 4),
      fit_runs=(('mnist_mlp', 256, 4),))


def _positive_finite(value):
  return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _run_sections(tmp_path_factory, sections):
  if not peak_lib.allocator_stats_enabled():
    pytest.skip('needs TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow loads')
  return runner.run(_tiny_config(), str(tmp_path_factory.mktemp('bench')),
                    sections)


# The sections run in three groups of a few seconds each, so that no one
# test carries the whole benchmark's set-up; the first test of each group
# below asks for its group alone. Adafactor reads the models' results.
@pytest.fixture(scope='module')
def model_results(tmp_path_factory):
  return _run_sections(tmp_path_factory,
                       ('models', 'overhead', 'build_overhead', 'adafactor'))


@pytest.fixture(scope='module')
def keras_results(tmp_path_factory):
  return _run_sections(tmp_path_factory, ('keras',))


@pytest.fixture(scope='module')
def lever_results(tmp_path_factory):
  return _run_sections(tmp_path_factory, ('levers', 'fit'))


@pytest.fixture(scope='module')
def outputs(tmp_path_factory, model_results, keras_results, lever_results):
  """(results as written to results.json, results.md, out_dir) of all three
  groups, as one run of every section would have written them."""
  results = copy.deepcopy(model_results)
  for group in (keras_results, lever_results):
    for key, value in group.items():
      if key == 'seconds':
        results['seconds'].update(value)
      elif key not in results:
        results[key] = copy.deepcopy(value)
  out_dir = str(tmp_path_factory.mktemp('bench'))
  # Stand-in curves: the real convergence runs train Estimators for minutes.
  curve = {'steps': [0, 1, 2], 'loss': [2.0, 1.0, 0.5]}
  run = {'eval_accuracy': 0.9, 'eval_loss': 0.3, 'final_train_loss': 0.5,
         'train_seconds': 1.0, 'loss_curve': curve}
  results['convergence'] = {'mnist_mlp': {
      'float32': run, 'bfloat16': run, 'steps': 3,
      'accuracy_difference': 0.0, 'eval_loss_ratio': 1.0}}
  table = report.write_outputs(results, out_dir)
  with open(os.path.join(out_dir, 'results.json')) as saved:
    return json.load(saved), table, out_dir


@pytest.mark.slow
def test_the_model_sections_ran(model_results):
  assert set(model_results['models']) == {'mnist_mlp'}
  assert model_results['overhead']['timed_steps_each'] == 4
  assert model_results['adafactor']['slot_bytes_ratio'] < 0.5


@pytest.mark.slow
def test_the_keras_comparison_ran_in_its_own_process(keras_results):
  keras = keras_results['keras_mixed_bfloat16']
  assert keras['model'] == 'mnist_mlp'
  assert 'models' not in keras_results


@pytest.mark.slow
def test_the_lever_sections_ran(lever_results):
  assert lever_results['levers']['accumulation']
  assert len(lever_results['fit']) == 8


@pytest.mark.slow
def test_lever_figures_are_the_quotients_they_name(outputs):
  results, table, _ = outputs
  lever = results['levers']
  run = lever['accumulation'][0]
  memory = run['memory']
  assert (run['effective_batch'], run['micro_batch'], run['steps']) == (
      256, 64, 4)
  assert memory['micro']['batch_size'] == 64
  assert memory['accumulated']['batch_size'] == 256
  assert run['peak_ratio_to_micro'] == pytest.approx(
      memory['accumulated']['peak_step_bytes'] /
      memory['micro']['peak_step_bytes'])
  assert run['peak_ratio_to_big'] == pytest.approx(
      memory['accumulated']['peak_step_bytes'] /
      memory['big']['peak_step_bytes'])
  # The accumulators are one float32 copy of the trainable weights.
  assert (memory['accumulated']['slot_bytes'] - memory['micro']['slot_bytes']
          == memory['micro']['parameter_bytes'])
  assert _positive_finite(run['speed_ratio_to_micro'])
  recompute = lever['recompute'][0]
  assert recompute['step_time_ratio'] == pytest.approx(
      1.0 / recompute['speed']['ratio'])
  assert recompute['peak_ratio'] == pytest.approx(
      recompute['memory']['recompute']['peak_step_bytes'] /
      recompute['memory']['plain']['peak_step_bytes'])
  both = lever['both']
  assert both['ratio_to_float32'] == pytest.approx(
      both['memory']['peak_step_bytes'] / both['float32_planned_bytes'])
  targets = [row['target'] for row in report.targets(results)]
  assert any(t.startswith('accumulation: peak') for t in targets)
  assert any(t.startswith('both levers') for t in targets)
  assert '**Gradient accumulation**' in table
  assert '**Recompute**' in table


@pytest.mark.slow
def test_the_planner_is_checked_for_every_lever_combination(outputs):
  results, table, _ = outputs
  rows = results['fit']
  assert [(r['precision'], r['levers'], r['steps'], r['recompute'])
          for r in rows] == [
              (precision, name, 4 if name in ('accumulate', 'both') else 1,
               name in ('recompute', 'both'))
              for precision in ('float32', 'bfloat16')
              for name in ('plain', 'accumulate', 'recompute', 'both')]
  for row in rows:
    assert _positive_finite(row['measured_bytes'])
    assert row['relative_error'] == pytest.approx(
        row['planned_bytes'] / row['measured_bytes'] - 1)
  worst = max(abs(r['relative_error']) for r in rows)
  target = next(t for t in report.targets(results)
                if t['target'].startswith('planner within') and
                'every lever combination' in t['target'])
  assert ('%.2f' % -worst in target['measured'] or
          '%.2f' % worst in target['measured'])
  assert '**The planner per lever combination**' in table


@pytest.mark.slow
def test_every_figure_of_the_issue_is_there(outputs):
  results, _, _ = outputs
  env = results['env']
  assert env['native_bfloat16'] == cpu_bfloat16.native_bfloat16()
  assert env['tensorflow'] and env['cpu_flags']
  assert set(results['models']) == {'mnist_mlp'}
  model = results['models']['mnist_mlp']
  for variant in runner.VARIANTS:
    row = model[variant]
    assert _positive_finite(row['peak_step_bytes']), variant
    # Two memory rounds; the reported peak is the lower-median one.
    runs = row['memory']['peak_step_bytes_runs']
    assert len(runs) == 2, variant
    assert row['peak_step_bytes'] == min(runs), variant
    assert _positive_finite(row['examples_per_sec']), variant
    # The model's own number of windows, not the default two.
    assert len(model['throughput_windows'][variant]) == 3
  # No search configured here beyond two measurements: a fitting batch.
  assert model['float32']['max_batch'] >= 64
  assert model['float32']['planner']['relative_error_at_batch'] is not None
  # Memory alone at the second batch, float32 and ours, planner checked.
  second = model['memory_at_second_batch']
  assert second['batch_size'] == 256
  for precision in ('float32', 'bfloat16'):
    assert (second[precision]['peak_tensor_bytes'] >
            model[precision]['peak_tensor_bytes']), precision
    assert model[precision]['planner'][
        'relative_error_at_second_batch'] is not None
  assert 'mnist_mlp/bfloat16/at_second_batch' in results['planner'][
      'relative_errors']
  assert results['overhead']['timed_steps_each'] == 4
  assert results['keras_mixed_bfloat16']['model'] == 'mnist_mlp'
  assert results['adafactor']['slot_bytes_ratio'] < 0.5


@pytest.mark.slow
def test_ratios_are_the_quotients_they_name(outputs):
  results, _, _ = outputs
  model = results['models']['mnist_mlp']
  ratios = model['ratios']
  for prefix, key in (('', 'peak_tensor_bytes'),
                      ('allocator_', 'peak_step_bytes')):
    peak = lambda v, key=key: model[v][key]
    assert ratios[prefix + 'memory'] == pytest.approx(
        peak('bfloat16') / peak('float32'))
    assert ratios[prefix + 'rewrite_memory'] == pytest.approx(
        peak(runner.REWRITE) / peak('float32'))
    assert ratios[prefix + 'memory_vs_rewrite'] == pytest.approx(
        peak('bfloat16') / peak(runner.REWRITE))
  second = model['memory_at_second_batch']
  assert second['ratio'] == pytest.approx(
      second['bfloat16']['peak_tensor_bytes'] /
      second['float32']['peak_tensor_bytes'])
  windows = model['throughput_windows']
  for key, top, bottom in (('throughput', 'bfloat16', 'float32'),
                           ('rewrite_throughput', runner.REWRITE, 'float32'),
                           ('throughput_vs_rewrite', 'bfloat16',
                            runner.REWRITE)):
    paired = [a / b for a, b in zip(windows[top], windows[bottom])]
    assert ratios[key] == pytest.approx(statistics.median(paired)), key
    assert min(paired) <= ratios[key] <= max(paired)
  for variant in runner.VARIANTS:
    assert model[variant]['examples_per_sec'] == pytest.approx(
        statistics.median(windows[variant]))


@pytest.mark.slow
def test_each_variant_ran_what_it_claims(outputs):
  results, _, _ = outputs
  model = results['models']['mnist_mlp']
  executed = {v: model[v]['memory']['executed'] for v in runner.VARIANTS}
  # float32 runs no casts of its own; ours casts the weights it reads and
  # the logits; TensorFlow's rewrite inserts its casts at run time, into
  # the very float32 graph.
  assert executed['float32']['casts'] == 0
  assert executed['bfloat16']['casts'] > 0
  # TensorFlow enables its rewrite only on some CPUs (AVX512F): where it
  # does, it must have inserted casts; elsewhere it must have left the
  # float32 graph alone, and the results must say it did not apply.
  active = results['env']['onednn_rewrite_active']
  assert (executed[runner.REWRITE]['casts'] > 0) == active
  assert model[runner.REWRITE]['applied'] == active
  for variant in ('bfloat16', runner.REWRITE)[:2 if active else 1]:
    assert 0 < executed[variant]['cast_bytes']
    assert executed[variant]['cast_micros'] <= executed[variant]['op_micros']
  assert model['bfloat16']['graph']['bfloat16_flop_share'] > 0.9
  assert model['float32']['graph']['bfloat16_flop_share'] == 0.0


@pytest.mark.slow
def test_build_overhead_per_model_fn_call(outputs):
  results, _, _ = outputs
  build = results['build_overhead']['mnist_mlp']
  assert build['calls'] == 2
  for variant in ('float32', 'hand_written_bfloat16', 'wrapped_bfloat16'):
    assert len(build['seconds'][variant]) == 2
    assert build[variant + '_seconds'] == min(build['seconds'][variant])
    assert build[variant + '_median_seconds'] == pytest.approx(
        statistics.median(build['seconds'][variant]))
  assert build['wrapper_seconds_per_call'] == pytest.approx(
      build['wrapped_bfloat16_seconds'] -
      build['hand_written_bfloat16_seconds'])


@pytest.mark.slow
def test_memory_bookkeeping_adds_up(outputs):
  results, _, _ = outputs
  for model in results['models'].values():
    for precision in ('float32', 'bfloat16'):
      measured = model[precision]['memory']
      assert (measured['persistent_bytes'] + measured['transient_bytes'] ==
              measured['peak_step_bytes'])
      # Variables and slots are float32 in both precisions and all live
      # between steps.
      variables = measured['parameter_bytes'] + measured['slot_bytes']
      assert measured['persistent_bytes'] >= 0.9 * variables
      # The live tensors hold the variables and something more at their
      # peak; the allocator holds at least that (it rounds up to chunks).
      assert variables < measured['peak_tensor_bytes']
      assert measured['peak_tensor_bytes'] <= measured['peak_step_bytes']
      search = model[precision]['max_batch_search']
      for batch, peak in search['measurements']:
        if batch == model[precision]['max_batch']:
          assert peak <= search['budget_bytes']
    assert (model['float32']['memory']['parameter_bytes'] ==
            model['bfloat16']['memory']['parameter_bytes'])


@pytest.mark.slow
def test_wrapper_adds_only_casts(outputs):
  results, _, _ = outputs
  overhead = results['overhead']
  assert overhead['extra_ops_besides_casts'] == {}
  # The MLP's dropout: its select and the select's gradient.
  assert overhead['replaced_ops'] == {'SelectV2 -> MulNoNan': 2}
  assert overhead['wrapped_bfloat16_flop_share'] == 1.0


def test_graph_comparison_tells_replaced_from_added_ops():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from benchmarks import overhead  # pylint: disable=g-import-not-at-top
  def inputs():
    return tf.ones([4], tf.bfloat16), tf.ones([4], tf.bool)

  with tf.Graph().as_default() as hand_written:
    x, mask = inputs()
    tf.where(mask, x, tf.zeros([], tf.bfloat16))
    tf.where(mask, x, tf.zeros([], tf.bfloat16))
  with tf.Graph().as_default() as wrapped:
    x, mask = inputs()
    y = tf.math.multiply_no_nan(x, tf.cast(mask, tf.bfloat16))
    tf.where(mask, x, tf.zeros([], tf.bfloat16))
    tf.math.multiply_no_nan(y, tf.cast(mask, tf.bfloat16))  # one too many
    tf.abs(y)
  compared = overhead.compare_graphs(wrapped, hand_written)
  assert compared['replaced_ops'] == {'SelectV2 -> MulNoNan': 1}
  assert compared['extra_ops_besides_casts'] == {'MulNoNan': 1, 'Abs': 1}
  assert compared['wrapped_casts'] - compared['hand_written_casts'] == 2


@pytest.mark.slow
def test_adafactor_state_is_smaller_than_adam(outputs):
  results, _, _ = outputs
  assert results['adafactor']['slot_bytes_ratio'] < 0.5


@pytest.mark.slow
def test_targets_are_judged_from_the_numbers(outputs):
  results, _, _ = outputs
  rows = {row['target']: row for row in results['targets']}
  native = results['env']['bfloat16_kernels_native']
  vs_rewrite = results['models']['mnist_mlp']['ratios'][
      'throughput_vs_rewrite']
  speed = rows['throughput ours / TF oneDNN rewrite >= 1.0 (every model)']
  # With the spread of its paired windows, so a tie reads as one.
  q1, q3 = results['models']['mnist_mlp']['ratios'][
      'throughput_vs_rewrite_iqr']
  assert ('mnist_mlp %.2f (IQR %.2f-%.2f)' % (vs_rewrite, q1, q3)
         ) in speed['measured']
  active = results['env']['onednn_rewrite_active']
  if not native:
    assert speed['met'] is None and 'emulated' in speed['measured']
  elif not active:
    assert speed['met'] is None and 'inactive' in speed['measured']
  else:
    assert speed['met'] == (vs_rewrite >= 1.0)
  memory_row = rows[
      'peak step memory ours / TF oneDNN rewrite <= 1.0 (every model)']
  if active:
    assert memory_row['met'] == (results['models']['mnist_mlp']['ratios'][
        'memory_vs_rewrite'] <= 1.0)
  else:
    assert memory_row['met'] is None and 'inactive' in memory_row['measured']
  assert rows['wrapper adds no ops besides casts']['met'] is True
  second = results['models']['mnist_mlp']['memory_at_second_batch']
  second_row = rows['peak step memory bf16/fp32 <= 0.60 (at the second '
                    'batch: mnist_mlp batch 256)']
  assert ('mnist_mlp %.2f' % second['ratio']) in second_row['measured']
  assert second_row['met'] == (second['ratio'] <= 0.60)
  # No ResNet or BERT in this run: their targets are unmeasured, not met.
  assert rows['throughput bf16/fp32 >= 1.6x (BERT)']['met'] is None
  assert rows['throughput bf16/fp32 >= 1.6x (BERT)']['measured'] == 'n/a'


@pytest.mark.slow
def test_report_files_and_results_block_splice(outputs, tmp_path):
  results, table, out_dir = outputs
  for name in ('results.json', 'results.md', 'convergence.png',
               'readme_block.md'):
    assert os.path.getsize(os.path.join(out_dir, name)) > 0
  assert table.startswith('# estimator_bf16 benchmarks')
  assert (report.EMULATED_NOTE in table) != bool(
      results['env']['bfloat16_kernels_native'])
  assert (report.REWRITE_INACTIVE_NOTE in table) != bool(
      results['env']['onednn_rewrite_active'])
  with open(os.path.join(out_dir, 'readme_block.md')) as f:
    block = f.read()
  assert results['env']['date'] in block
  row = next(line for line in block.splitlines()
             if line.startswith('| mnist_mlp |'))
  assert '%.2f' % results['models']['mnist_mlp']['ratios'][
      'memory_vs_rewrite'] in row
  assert 'mnist_mlp at batch 256' in block and 'mnist_mlp at batch 256' in table
  doc = tmp_path / 'benchmarks.md'
  doc.write_text('# x\n\n%s\nold table\n%s\n\nrest\n' % (
      update_readme.BEGIN, update_readme.END))
  update_readme.main([out_dir, '--doc', str(doc), '--allow_emulated'])
  text = doc.read_text()
  assert 'old table' not in text and block.strip() in text
  assert text.endswith('%s\n\nrest\n' % update_readme.END)
  with pytest.raises(ValueError):
    update_readme.splice('no markers', block)


def test_the_results_block_is_in_docs_benchmarks():
  # The script's default document holds the markers, once each, in order.
  with open(os.path.join(paths.REPO, 'docs', 'benchmarks.md')) as f:
    text = f.read()
  assert text.count(update_readme.BEGIN) == 1
  assert text.count(update_readme.END) == 1
  assert update_readme.splice(text, 'x\n') != text


def test_the_doc_keeps_the_native_table_on_an_emulating_cpu(tmp_path):
  out = tmp_path / 'run'
  out.mkdir()
  (out / 'results.json').write_text(json.dumps({'env': {
      'native_bfloat16': False, 'bfloat16_kernels_native': False,
      'cpu': 'AVX2 box', 'date': '2026-01-01 00:00 UTC'}}))
  (out / 'readme_block.md').write_text('new\n')
  doc = tmp_path / 'benchmarks.md'
  before = '%s\nnative table\n%s\n' % (update_readme.BEGIN,
                                         update_readme.END)
  doc.write_text(before)
  assert update_readme.main([str(out), '--doc', str(doc)]) == 0
  assert doc.read_text() == before


def _traced_run(graph, fetch):
  """Initialises `graph`'s variables, runs `fetch` once one op at a time
  with FULL_TRACE, and returns the `RunMetadata`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with tf.compat.v1.Session(graph=graph) as session:
    session.run(tf.compat.v1.global_variables_initializer())
    metadata = tf.compat.v1.RunMetadata()
    session.run(fetch, options=peak_lib.traced_run_options(),
                run_metadata=metadata)
  return metadata


def test_live_tensor_peak_counts_what_is_alive_together():
  # a = v * 2 and b = a * 3 (4 MiB each) must be alive together for a * b,
  # whose result may reuse one of their buffers; the variable was
  # allocated before the step and does not count.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if not peak_lib.allocator_stats_enabled():
    pytest.skip('needs TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow loads')
  with tf.Graph().as_default() as graph:
    v = tf.compat.v1.get_variable('v', [1024, 1024], use_resource=True)
    a = tf.identity(v * 2.0)
    b = a * 3.0
    total = tf.reduce_sum(a * b)
    metadata = _traced_run(graph, total)
  peak = peak_lib.live_tensor_peak(metadata)
  assert 8 * MiB <= peak <= 12 * MiB + 64 * 1024


def test_live_tensor_peak_counts_a_variable_once_after_a_copying_assign():
  # A sparse update puts the variable in copy-on-read mode, so the assign
  # copies its value into a new 4 MiB buffer, which the variable keeps; its
  # old buffer goes then, unrecorded. After it, a and b (8 MiB each) are
  # alive together: 16 MiB. Counting the kept copy to the end gave 20.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if not peak_lib.allocator_stats_enabled():
    pytest.skip('needs TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow loads')
  with tf.Graph().as_default() as graph:
    v = tf.compat.v1.get_variable('v', [1024, 1024], use_resource=True)
    sparse = v.scatter_add(tf.IndexedSlices(tf.ones([2, 1024]), [0, 1]))
    with tf.control_dependencies([sparse]):
      assign = v.assign(v.read_value() * 2.0, read_value=False)
    with tf.control_dependencies([assign]):
      a = tf.random.uniform([2048, 1024])
    b = a * 3.0
    total = tf.reduce_sum(a * b)
    metadata = _traced_run(graph, total)
  kept = [record.alloc_bytes
          for device in metadata.step_stats.dev_stats
          for node in device.node_stats if node.node_name == assign.name
          for memory in node.memory
          for record in memory.allocation_records]
  assert kept == [4 * MiB], 'the assign no longer copies: %s' % kept
  peak = peak_lib.live_tensor_peak(metadata)
  assert 16 * MiB <= peak <= 16 * MiB + 64 * 1024


def test_max_batch_search_brackets_a_linear_peak(monkeypatch):
  # A made-up peak of 100 + 3 * batch bytes, against a budget of 1000.
  class FakeStep(object):

    def __init__(self, batch):
      self.batch_size = batch

  def fake_measure(step):
    return {'batch_size': step.batch_size,
            'peak_step_bytes': 100 + 3 * step.batch_size}

  monkeypatch.setattr(step_memory, 'measure_step_memory', fake_measure)
  result = step_memory.max_batch_in_budget(
      FakeStep, 1000, guess=250, known=[fake_measure(FakeStep(10))],
      tolerance=0.05)
  assert result['max_batch'] <= 300 < result['smallest_failing_batch']
  assert result['smallest_failing_batch'] <= 1.05 * result['max_batch'] + 1
  assert result['peak_at_max_batch'] <= 1000


def test_kernel_probe_structure():
  for kind in ('matmul', 'conv2d'):
    probe = kernels.kernel_speed(kind, 64, warmup_steps=1, window_steps=1,
                                 windows=2)
    assert probe['kind'] == kind
    assert _positive_finite(probe['speed_ratio'])
    assert len(probe['speed_ratio_iqr']) == 2


@pytest.mark.slow
def test_an_emulating_cpu_gets_every_figure_but_no_speed_verdict(outputs):
  results, _, _ = outputs
  emulated = json.loads(json.dumps(results))
  # An AVX512F CPU without AVX512-BF16: the rewrite acts, bfloat16 is slow.
  emulated['env'].update(native_bfloat16=False,
                         bfloat16_kernels_native=False,
                         onednn_rewrite_active=True)
  emulated['models']['mnist_mlp'][runner.REWRITE]['applied'] = True
  # The program times one window there (configs.for_emulated_bfloat16):
  # ratios without a spread.
  for key in ('throughput_iqr', 'rewrite_throughput_iqr',
              'throughput_vs_rewrite_iqr'):
    emulated['models']['mnist_mlp']['ratios'][key] = None
  emulated['keras_mixed_bfloat16']['throughput_ratio_iqr'] = None
  rows = {row['target']: row for row in report.targets(emulated)}
  for target in ('throughput ours / TF oneDNN rewrite >= 1.0 (every model)',
                 'throughput ours / Keras mixed_bfloat16 >= 1.0'):
    assert rows[target]['met'] is None, target
    assert 'emulated' in rows[target]['measured'], target
  # Memory is still judged.
  assert rows['peak step memory ours / TF oneDNN rewrite <= 1.0 (every '
              'model)']['met'] == (results['models']['mnist_mlp']['ratios'][
                  'memory_vs_rewrite'] <= 1.0)
  table = report.markdown(emulated)
  assert report.EMULATED_NOTE in table
  keras_line = next(line for line in table.splitlines()
                    if line.startswith('**Against Keras'))
  assert 'IQR' not in keras_line
  assert '| mnist_mlp | 64 |' in report.readme_block(emulated)
  assert report.REWRITE_INACTIVE_NOTE not in table
  assert '| mnist_mlp | 64 |' in table


@pytest.mark.slow
def test_an_inactive_rewrite_is_said_and_not_judged(outputs):
  results, _, _ = outputs
  inactive = json.loads(json.dumps(results))
  inactive['env'].update(native_bfloat16=True, bfloat16_kernels_native=True)
  inactive['models']['mnist_mlp'][runner.REWRITE]['applied'] = False
  rows = {row['target']: row for row in report.targets(inactive)}
  for target in ('throughput ours / TF oneDNN rewrite >= 1.0 (every model)',
                 'peak step memory ours / TF oneDNN rewrite <= 1.0 (every '
                 'model)'):
    assert rows[target]['met'] is None, target
    assert 'TF rewrite inactive' in rows[target]['measured'], target
  # Targets that do not involve the rewrite are still judged.
  assert rows['throughput ours / Keras mixed_bfloat16 >= 1.0']['met'] == (
      results['keras_mixed_bfloat16']['throughput_ratio'] >= 1.0)
  assert report.REWRITE_INACTIVE_NOTE in report.markdown(inactive)
  assert report.REWRITE_INACTIVE_NOTE in report.readme_block(inactive)
  # TensorFlow's own CPU check says no: a model whose float32 graph runs
  # casts of its own does not make the rewrite count as active.
  inactive['env']['onednn_rewrite_active'] = False
  inactive['models']['mnist_mlp'][runner.REWRITE]['applied'] = True
  rows = {row['target']: row for row in report.targets(inactive)}
  assert rows['peak step memory ours / TF oneDNN rewrite <= 1.0 (every '
              'model)']['met'] is None


def _peer_results(ratios):
  """Results of a native run with the rewrite active: {model: (r, iqr)}."""
  models = {
      name: {'spec': {'name': name, 'family': 'resnet'},
             'ratios': {'throughput_vs_rewrite': ratio,
                        'throughput_vs_rewrite_iqr': iqr},
             runner.REWRITE: {'applied': True}}
      for name, (ratio, iqr) in ratios.items()}
  return {'env': {'bfloat16_kernels_native': True,
                  'onednn_rewrite_active': True},
          'models': models}


def test_a_miss_within_its_iqr_is_named_and_still_a_miss():
  target = 'throughput ours / TF oneDNN rewrite >= 1.0 (every model)'
  results = _peer_results({'tie': (0.997, [0.977, 1.044]),
                           'slower': (0.95, [0.93, 0.97]),
                           'faster': (1.2, [1.1, 1.3]),
                           'one_window': (0.99, None)})
  row = next(r for r in report.targets(results) if r['target'] == target)
  assert row['met'] is False
  assert row['within_noise'] == ['tie']
  line = next(l for l in report._targets_table(results)  # pylint: disable=protected-access
              if l.startswith('| ' + target))
  assert line.endswith('| no (within its IQR: tie) |')
  # Met, or not judged: nothing to name.
  results = _peer_results({'tie': (1.01, [0.98, 1.04])})
  row = next(r for r in report.targets(results) if r['target'] == target)
  assert row['met'] is True and row['within_noise'] == []
  results['env']['bfloat16_kernels_native'] = False
  results['models']['tie']['ratios']['throughput_vs_rewrite'] = 0.99
  row = next(r for r in report.targets(results) if r['target'] == target)
  assert row['met'] is None and row['within_noise'] == []


def _executed_casts(float32, rewrite):
  return {'float32': {'executed': {'casts': float32}},
          runner.REWRITE: {'executed': {'casts': rewrite}}}


def test_the_rewrite_counts_as_applied_only_with_casts_of_its_own():
  # BERT's float32 graph casts its integer mask: one cast in both runs is
  # the float32 graph's, not the rewrite's.
  assert not runner.rewrite_applied(_executed_casts(1, 1))
  assert not runner.rewrite_applied(_executed_casts(0, 0))
  assert runner.rewrite_applied(_executed_casts(1, 40))
  assert runner.rewrite_applied(_executed_casts(0, 12))


def test_head_to_head_pairs_ours_with_the_rewrite(monkeypatch):
  timed = {}
  real = graphs.time_train_steps

  def spy(steps, **kwargs):
    timed.update(steps=steps, **kwargs)
    return real(steps, **kwargs)

  monkeypatch.setattr(graphs, 'time_train_steps', spy)
  spec = dataclasses.replace(configs.find_model('mnist_mlp'), batch_size=32)
  result = head_to_head.compare(spec, windows=4, window_steps=2,
                                warmup_steps=1)
  # Ours is the bfloat16 graph; the rewrite runs the float32 one in a
  # session with TensorFlow's rewrite on.
  def matmul_dtypes(step):
    return {op.get_attr('T') for op in step.graph.get_operations()
            if op.type == 'MatMul'}
  assert matmul_dtypes(timed['steps'][head_to_head.OURS]) == {tf.bfloat16}
  assert matmul_dtypes(timed['steps'][configs.REWRITE]) == {tf.float32}
  rewrite_options = timed['session_configs'][
      configs.REWRITE].graph_options.rewrite_options
  assert (rewrite_options.auto_mixed_precision_onednn_bfloat16 ==
          rewriter_config_pb2.RewriterConfig.ON)
  assert head_to_head.OURS not in timed['session_configs']
  ours = result['windows'][head_to_head.OURS]
  rewrite = result['windows'][configs.REWRITE]
  assert len(ours) == len(rewrite) == 4
  assert all(rate > 0 for rate in ours + rewrite)
  quotients = [a / b for a, b in zip(ours, rewrite)]
  assert result['ratio'] == pytest.approx(statistics.median(quotients))


def test_the_mnist_tpu_model_is_the_programs_network_in_bfloat16():
  # tensorflow/tpu's mnist_tpu.py network (tf.compat.v1.layers objects),
  # at a small batch: ours computes its convolutions and matmuls in
  # bfloat16 on float32 variables; its parameter count is the program's.
  spec = dataclasses.replace(configs.find_model('mnist_tpu_1024'),
                             batch_size=8)
  step = graphs.build_train_step(spec, 'bfloat16', spec.batch_size)
  ops = step.graph.get_operations()
  products = [op for op in ops if op.type in ('Conv2D', 'MatMul')]
  assert len([op for op in products if op.type == 'Conv2D']) == 2
  assert {op.get_attr('T') for op in products} == {tf.bfloat16}
  with step.graph.as_default():
    variables = tf.compat.v1.trainable_variables()
  assert {v.dtype.base_dtype for v in variables} == {tf.float32}
  # 5*5*1*32+32, 5*5*32*32+32, 7*7*32*1024+1024, 1024*10+10
  assert sum(v.shape.num_elements() for v in variables) == 1643370
  assert any(op.type == 'MulNoNan' for op in ops)  # the dropout's masks


@pytest.mark.parametrize('names, itself, each_other', [
    (('a', 'b'), 4, 4), (('f32', 'ours', 'rewrite'), 0, 4)])
def test_every_variant_follows_every_variant_equally_often(
    names, itself, each_other):
  # A window that follows another graph can start colder than one that
  # follows its own; no variant may be favoured by its place in the rounds.
  calls = []
  variants = {name: (lambda name=name: calls.append(name), 1)
              for name in names}
  windows = 8
  rates = throughput.alternating_windows(
      variants, warmup_steps=1, window_steps=1, windows=windows)
  timed = calls[len(names):]  # after one warm-up step each
  assert timed == [name for order in throughput.window_order(names, windows)
                   for name in order]
  assert all(len(rates[name]) == windows for name in names)
  # Every timed window's predecessor, the last warm-up step's included.
  preceded = calls[len(names) - 1:]
  counts = collections.Counter(zip(preceded, preceded[1:]))
  assert sum(counts.values()) == windows * len(names)
  for before in names:
    for after in names:
      expected = itself if before == after else each_other
      assert counts.get((before, after), 0) == expected, counts


def test_window_order_rejects_what_it_cannot_balance():
  for names in (['ours'], ['ours', 'ours'], ['a', 'b', 'c', 'd']):
    with pytest.raises(ValueError, match='two or three distinct'):
      throughput.window_order(names, 4)


def test_one_window_has_no_spread():
  one = throughput.summarize({'a': [2.0], 'b': [4.0]}, 'a', 'b')
  assert one['ratio'] == 0.5 and one['ratio_iqr'] is None
  many = throughput.summarize({'a': [2.0, 3.0, 4.0], 'b': [4.0] * 3},
                              'a', 'b')
  assert many['ratio'] == 0.75 and many['ratio_iqr'][0] < 0.75


@pytest.mark.parametrize('native, time_emulated, cut', [
    (True, False, False), (None, False, False), (False, False, True),
    (False, True, False)])
def test_the_program_cuts_timing_only_where_bfloat16_is_emulated(
    monkeypatch, tmp_path, native, time_emulated, cut):
  ran = {}
  # The program sets up logging for its process; keep the test's as it is.
  monkeypatch.setattr(benchmark_program.logging, 'set_verbosity',
                      lambda level: None)
  monkeypatch.setattr(benchmark_program.logging, 'use_absl_handler',
                      lambda: None)
  monkeypatch.setenv('TF_CPP_MIN_LOG_LEVEL', '2')
  monkeypatch.setattr(
      cpu_bfloat16, 'bfloat16_support',
      lambda: cpu_bfloat16.Bfloat16Support(native, (), 'stated by the test'))
  monkeypatch.setattr(runner, 'run', lambda config, out, sections: ran.update(
      config=config) or {})
  monkeypatch.setattr(report, 'write_outputs', lambda results, out: '')
  benchmark_program.main(['--quick', '--verbose', '--out', str(tmp_path)] +
                         (['--time_emulated'] if time_emulated else []))
  quick = configs.get_config('quick')
  config = ran['config']
  assert config.models == quick.models  # sizes are never cut
  assert config.memory_rounds == quick.memory_rounds
  if cut:
    assert (config.warmup_steps, config.windows) == (1, 1)
    # The small nets get ten windows on a native CPU; here, one.
    assert all(config.windows_for(m.name) == 1 for m in config.models)
    assert any(quick.windows_for(m.name) > 1 for m in quick.models)
    assert config.overhead_windows == quick.overhead_windows
  else:
    assert config == quick


@pytest.mark.slow
def test_xla_tables_are_the_quotients_they_name(tmp_path):
  # The XLA sections at the MLP's size: a recompute row and the planner's
  # eight lever/precision rows, with the figures each row is made of.
  config = dataclasses.replace(
      _tiny_config(), xla_recompute_runs=(('mnist_mlp', 64, 'bfloat16'),),
      xla_planner_runs=(('mnist_mlp', 64),))
  results = runner.run(config, str(tmp_path), ('xla_recompute',
                                               'xla_planner'))
  (recompute,) = results['xla_recompute']
  assert recompute['bytes_ratio'] == pytest.approx(
      recompute['recompute_mib'] / recompute['plain_mib'])
  assert _positive_finite(recompute['time_ratio'])
  rows = results['xla_planner']
  assert [(r['precision'], r['levers']) for r in rows] == [
      (precision, levers) for precision in ('float32', 'bfloat16')
      for levers in ('plain', 'accumulate', 'recompute', 'both')]
  for row in rows:
    assert _positive_finite(row['xla_mib'])
    assert row['error'] == pytest.approx(
        row['planned_mib'] / row['xla_mib'] - 1)
    assert row['executor_error'] == pytest.approx(
        row['executor_mib'] / row['xla_mib'] - 1)
    assert set(row['xla_products']) <= {'f32', 'bf16'}
    if row['precision'] == 'float32':
      assert row['xla_products'].get('bf16', 0) == 0
  lines = report.xla_lines(results)
  (bf16_plain,) = [l for l in lines
                    if l.startswith('| mnist_mlp | 64 | bfloat16 | plain |')]
  assert bf16_plain.endswith('| %d of %d |' % (
      rows[4]['xla_products'].get('bf16', 0),
      sum(rows[4]['xla_products'].values())))
  assert '**The planner against XLA**' in '\n'.join(lines)
  assert len([l for l in lines if l.startswith('| mnist_mlp')]) == 9


def test_check_time_builds_the_issue_command_and_times_a_child(tmp_path):
  """benchmarks/check_time: its command is `check`'s, on train_cli's flags.

  The timed command itself (20 s or more here) is the benchmark's; the
  suite runs `check --xla` in tests/memory/test_xla_step.py.
  """
  from benchmarks import check_time  # pylint: disable=g-import-not-at-top
  from estimator_bf16.apps import cli  # pylint: disable=g-import-not-at-top
  from estimator_bf16.apps import training  # pylint: disable=g-import-not-at-top
  argv = check_time.command(str(tmp_path), resnet_depth=18, image_size=224,
                            batch=64)
  assert argv[:4] == [sys.executable, '-m', 'estimator_bf16', 'check']
  args = cli.build_parser().parse_args(argv[3:])
  assert (args.command, args.precision, args.xla, args.device) == (
      'check', 'bfloat16', True, 'tpu-v2')
  assert args.program == check_time.PROGRAM
  assert os.path.exists(os.path.join(check_time._REPO, args.program))  # pylint: disable=protected-access
  # The program's flags are the training command's options.
  options = {f.name for f in dataclasses.fields(training.TrainOptions)}
  for flag in args.program_args:
    assert flag[2:].split('=')[0] in options, flag
  child = [sys.executable, '-c',
           'import sys\nfor i in range(40): print("line %d" % i, '
           'file=sys.stderr)\nprint("result: FAILED", file=sys.stderr)\n'
           'sys.exit(1)']
  timed = check_time.time_command(child, cwd=str(tmp_path))
  assert timed['exit_code'] == 1
  assert timed['result'] == 'result: FAILED'
  assert timed['seconds'] > 0
  # A failure shows its end, where the command says why.
  assert timed['tail'] == ['line %d' % i for i in range(26, 40)] + [
      'result: FAILED']
