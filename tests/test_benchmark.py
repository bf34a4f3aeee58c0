"""Smoke test of the benchmark machinery on tiny models: structure, not speed.

Runs the real sections (memory, largest batch, planner check, throughput,
wrapper overhead, Keras comparison in its subprocess, Adafactor) on models
small enough to take seconds, and checks that results.json carries every
figure the benchmark issue lists. No timing is asserted: only that ratios
are positive finite numbers and the bookkeeping adds up.
"""

import json
import math
import os

import pytest

from benchmarks import configs
from benchmarks import kernels
from benchmarks import memory
from benchmarks import report
from benchmarks import runner
from estimator_bf16 import memory as memory_lib

MiB = configs.MiB


def _tiny_config():
  # One model keeps it to seconds; graph building dominates, and BERT or
  # ResNet graphs take seconds each to build.
  models = (configs.ModelSpec('mnist_mlp', 'mnist_mlp', batch_size=64,
                              optimizer='adam', budget_mib=16),)
  return configs.BenchmarkConfig(
      mode='quick', models=models, warmup_steps=1,
      window_steps=(('mnist_mlp', 2),), windows=2,
      max_search_measurements=2, overhead_batch_size=32,
      overhead_window_steps=2, overhead_windows=2,
      adafactor_model='mnist_mlp', keras_batch_size=32, keras_window_steps=2)


def _positive_finite(value):
  return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.fixture(scope='module')
def outputs(tmp_path_factory):
  if not memory_lib.allocator_stats_enabled():
    pytest.skip('needs TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow loads')
  out_dir = str(tmp_path_factory.mktemp('bench'))
  results = runner.run(_tiny_config(), out_dir,
                       ('models', 'overhead', 'keras', 'adafactor'))
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


def test_every_figure_of_the_issue_is_there(outputs):
  results, _, _ = outputs
  for key in ('cpu_flags', 'tensorflow', 'onednn', 'native_bfloat16'):
    assert key in results['env'], key
  assert set(results['models']) == {'mnist_mlp'}
  for name, model in results['models'].items():
    assert any(family in name for family in ('resnet', 'bert', 'mnist'))
    for precision in ('float32', 'bfloat16'):
      row = model[precision]
      assert _positive_finite(row['peak_step_bytes']), (name, precision)
      assert _positive_finite(row['examples_per_sec']), (name, precision)
      assert isinstance(row['max_batch'], int) and row['max_batch'] >= 0
    for ratio in ('memory', 'throughput', 'max_batch'):
      assert _positive_finite(model['ratios'][ratio]), (name, ratio)
  assert _positive_finite(results['overhead']['step_time_ratio'])
  for key in ('throughput_ratio', 'memory_ratio'):
    assert _positive_finite(results['keras_mixed_bfloat16'][key]), key
  assert math.isfinite(results['planner']['relative_error'])
  assert _positive_finite(results['adafactor']['slot_bytes_ratio'])


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
      search = model[precision]['max_batch_search']
      for batch, peak in search['measurements']:
        if batch == model[precision]['max_batch']:
          assert peak <= search['budget_bytes']
    assert (model['float32']['memory']['parameter_bytes'] ==
            model['bfloat16']['memory']['parameter_bytes'])


def test_wrapper_adds_only_casts(outputs):
  results, _, _ = outputs
  overhead = results['overhead']
  assert overhead['extra_ops_besides_casts'] == {}
  assert overhead['wrapped_bfloat16_flop_share'] == 1.0


def test_adafactor_state_is_smaller_than_adam(outputs):
  results, _, _ = outputs
  assert results['adafactor']['slot_bytes_ratio'] < 0.5


def test_report_files(outputs):
  results, table, out_dir = outputs
  for name in ('results.json', 'results.md', 'convergence.png'):
    assert os.path.getsize(os.path.join(out_dir, name)) > 0
  assert table.startswith('# estimator_bf16 benchmarks')
  assert {row['target'] for row in results['targets']} >= {
      'largest batch in a budget bf16/fp32 >= 1.7x',
      'throughput ours / Keras mixed_bfloat16 >= 1.0'}
  for row in results['targets']:
    assert row['met'] in (True, False, None)


def test_max_batch_search_brackets_a_linear_peak(monkeypatch):
  # A made-up peak of 100 + 3 * batch bytes, against a budget of 1000.
  class FakeStep(object):

    def __init__(self, batch):
      self.batch_size = batch

  def fake_measure(step):
    return {'batch_size': step.batch_size,
            'peak_step_bytes': 100 + 3 * step.batch_size}

  monkeypatch.setattr(memory, 'measure_step_memory', fake_measure)
  result = memory.max_batch_in_budget(
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
