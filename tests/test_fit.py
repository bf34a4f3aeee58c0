"""Fitting a batch to a budget: the table's choice on plans whose numbers are known."""

import json
import os
import re

from absl.testing import parameterized
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16 import fit
from estimator_bf16 import memory_planner
from tests import legacy_model
from tests import test_runner

MiB = fit.MiB


def _plan(precision, per_example_mib, parameters_mib=100, slots_mib=200):
  """A plan with chosen numbers: persistent + per_example x batch."""
  per_example = per_example_mib * MiB
  return memory_planner.MemoryPlan(
      precision=precision, optimizer='adam',
      parameter_bytes=parameters_mib * MiB, state_bytes=0,
      slot_bytes=slots_mib * MiB, fixed_bytes=0,
      bytes_per_example=per_example, lines=((0.0, per_example),),
      upcast_lines=((0.0, per_example),), batch_sizes=(8, 16))


# float32 activations 8 MiB an example, bfloat16 4, recompute a quarter.
_PLANS = {('float32', False): _plan('float32', 8),
          ('float32', True): _plan('float32', 2),
          ('bfloat16', False): _plan('bfloat16', 4),
          ('bfloat16', True): _plan('bfloat16', 1)}


class FitTest(tf.test.TestCase, parameterized.TestCase):

  def test_every_combination_is_planned(self):
    result = fit.fit(_PLANS, 64, 1024 * MiB)
    # 2 precisions x 2 recompute x the 7 divisors of 64.
    self.assertLen(result.options, 28)
    option = next(o for o in result.options
                  if (o.precision, o.gradient_accumulation_steps,
                      o.recompute) == ('bfloat16', 4, False))
    # 300 MiB persistent + 16 examples x 4 MiB + 100 MiB of accumulators.
    self.assertEqual(option.planned_bytes, (300 + 64 + 100) * MiB)
    self.assertEqual(option.micro_batch, 16)

  @parameterized.named_parameters(
      # bfloat16 alone: 300 + 64 x 4 = 556 MiB.
      ('bfloat16_fits', 600, ('bfloat16', 1, False)),
      # 300 + 32 x 4 + 100 = 528 MiB with K=2; recompute would cost more.
      ('accumulation_is_cheaper_than_recompute', 540, ('bfloat16', 2, False)),
      # K=16 fits (300 + 16 + 100 = 416 MiB) at cost 1.0; recompute
      # (300 + 64 = 364 MiB) costs 1.2; K=8 (432 MiB) does not fit.
      ('accumulation_before_recompute', 420, ('bfloat16', 16, False)),
      ('recompute', 370, ('bfloat16', 1, True)),
      # float32 is never chosen while bfloat16 fits: it costs 1.7x.
      ('float32_only_when_alone', 5000, ('bfloat16', 1, False)))
  def test_the_cheapest_fitting_option_is_chosen(self, budget_mib, expected):
    result = fit.fit(_PLANS, 64, budget_mib * MiB)
    chosen = result.chosen
    self.assertEqual((chosen.precision, chosen.gradient_accumulation_steps,
                      chosen.recompute), expected)
    self.assertLessEqual(chosen.planned_bytes, budget_mib * MiB)
    self.assertTrue(all(chosen.cost <= o.cost for o in result.options
                        if o.fits))

  def test_nothing_fits(self):
    result = fit.fit(_PLANS, 64, 1 * MiB)
    self.assertIsNone(result.chosen)
    self.assertFalse(any(o.fits for o in result.options))
    lines = fit.model_parallel_lines(_PLANS[('bfloat16', True)], 1 * MiB)
    self.assertIn('num_cores_per_replica=2', '\n'.join(lines))
    self.assertIn('Adafactor', '\n'.join(lines))
    self.assertIn('input_partition_dims', '\n'.join(lines))

  def test_report_names_the_choice(self):
    result = fit.fit(_PLANS, 64, 600 * MiB)
    report = fit.report_dict(result)
    self.assertEqual(report['levers'], {'precision': 'bfloat16',
                                        'gradient_accumulation_steps': 1,
                                        'recompute': False})
    self.assertEqual(report['planned_peak_bytes'], (300 + 256) * MiB)
    self.assertEqual(report['budget_bytes'], 600 * MiB)
    marked = [line for line in fit.table_lines(result)
              if line.startswith('*')]
    self.assertLen(marked, 1)

  @parameterized.parameters(('8589934592', 8 * 2**30), ('512MiB', 512 * MiB),
                            ('8GiB', 8 * 2**30), ('1.5GB', 1500000000),
                            (' 2 KiB ', 2048))
  def test_sizes(self, text, expected):
    self.assertEqual(fit.parse_size(text), expected)

  @parameterized.parameters('8 gigs', '', '-1MiB', '0', 'MiB')
  def test_bad_sizes(self, text):
    with self.assertRaisesRegex(ValueError, 'size'):
      fit.parse_size(text)

  def test_devices(self):
    self.assertEqual(fit.device_bytes('tpu-v2'), 8 * 2**30)
    self.assertEqual(fit.device_bytes('tpu-v3'), 16 * 2**30)
    with self.assertRaisesRegex(ValueError, 'tpu-v2, tpu-v3, tpu-v4'):
      fit.device_bytes('tpu-v9')

  @parameterized.parameters(0, -4, 2.5, True)
  def test_bad_batch(self, batch):
    with self.assertRaisesRegex(ValueError, 'batch_per_core'):
      fit.fit(_PLANS, batch, 600 * MiB)


class ChooseLeversTest(tf.test.TestCase):
  """The library entry point on a real model_fn."""

  def test_a_tight_budget_gets_a_lever_beyond_bfloat16(self):
    features, labels = memory_planner.input_specs(legacy_model.train_input_fn)
    plain = memory_planner.memory_plan(
        legacy_model.model_fn, features=features, labels=labels,
        precision='bfloat16')
    roomy = eb.choose_levers(legacy_model.model_fn, features=features,
                             labels=labels, batch_per_core=512,
                             budget_bytes=2 * plain.step_bytes(512))
    self.assertEqual(roomy.chosen.levers, {
        'precision': 'bfloat16', 'gradient_accumulation_steps': 1,
        'recompute': False})
    budget = int(0.6 * plain.step_bytes(512))
    tight = eb.choose_levers(legacy_model.model_fn, features=features,
                             labels=labels, batch_per_core=512,
                             budget_bytes=budget)
    self.assertIsNotNone(tight.chosen)
    self.assertLessEqual(tight.chosen.planned_bytes, budget)
    self.assertTrue(tight.chosen.gradient_accumulation_steps > 1 or
                    tight.chosen.recompute)


_PROGRAM = 'tests/tf1_programs/bert_style/tf1_run_classifier.py'


def _cli(*args):
  return test_runner._cli(*args)  # pylint: disable=protected-access


class CheckFitCommandTest(tf.test.TestCase, parameterized.TestCase):
  """`check --fit` on the bert-style TF 1.x program (batch 32)."""

  def test_the_choice_and_its_json_agree(self):
    report = os.path.join(self.create_tempdir().full_path, 'fit.json')
    proc = _cli('check', '--fit', '--memory_budget=1MiB',
                '--report=' + report, _PROGRAM,
                '--output_dir=' + self.create_tempdir().full_path)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    chosen = re.search(r'^chosen: (.*), planned ([\d.]+) MiB of ([\d.]+) MiB',
                       proc.stdout, re.M)
    self.assertIsNotNone(chosen, proc.stdout)
    with open(report) as f:
      data = json.load(f)
    self.assertEqual(data['budget_bytes'], 2**20)
    self.assertAlmostEqual(data['planned_peak_bytes'] / 2**20,
                           float(chosen.group(2)), places=1)
    self.assertLessEqual(data['planned_peak_bytes'], data['budget_bytes'])
    levers = data['levers']
    self.assertEqual(set(levers), {'precision', 'gradient_accumulation_steps',
                                   'recompute'})
    self.assertTrue(chosen.group(1).startswith(levers['precision']))
    self.assertEqual('accumulate %d x' % levers['gradient_accumulation_steps']
                     in chosen.group(1),
                     levers['gradient_accumulation_steps'] > 1)
    self.assertEqual(data['bfloat16_flop_share'], 1.0)
    self.assertIsNone(data['peak_step_bytes'])
    self.assertLen(data['fit']['options'], 24)  # 2 x 2 x divisors of 32

  def test_an_impossible_budget_exits_1_with_model_parallel_advice(self):
    proc = _cli('check', '--fit', '--memory_budget=100KiB', _PROGRAM,
                '--output_dir=' + self.create_tempdir().full_path)
    self.assertEqual(proc.returncode, 1, proc.stderr[-3000:])
    self.assertIn('nothing fits', proc.stdout)
    self.assertIn('num_cores_per_replica=2', proc.stdout)
    self.assertIn('input_partition_dims', proc.stdout)

  def test_precision_float32_wins_over_the_fit(self):
    proc = _cli('check', '--fit', '--device=tpu-v2', '--precision=float32',
                _PROGRAM, '--output_dir=' + self.create_tempdir().full_path)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    rows = [line for line in proc.stdout.splitlines()
            if re.match(r'^\*?\s+(float32|bfloat16)\s+\d', line)]
    self.assertNotEmpty(rows)
    self.assertTrue(all('float32' in row for row in rows), rows)

  @parameterized.named_parameters(
      ('unknown_device', ['--fit', '--device=tpu-v9'], 'tpu-v2, tpu-v3'),
      ('budget_not_a_size', ['--fit', '--memory_budget=lots'],
       'is not a size'),
      ('fit_with_accumulate', ['--fit', '--device=tpu-v2', '--accumulate=2'],
       'chooses --accumulate'),
      ('no_target', ['--fit'], 'exactly one of --device'),
      ('device_without_fit', ['--device=tpu-v2'], 'go with --fit'))
  def test_bad_input_exits_2_before_running(self, args, message):
    proc = _cli('check', *args, _PROGRAM)
    self.assertEqual(proc.returncode, 2)
    self.assertIn(message, proc.stderr)


class RunReportTest(tf.test.TestCase):

  def test_run_report_json_matches_the_printed_report(self):
    folder = self.create_tempdir().full_path
    report = os.path.join(folder, 'run.json')
    proc = _cli('run', '--memory', '--accumulate=2', '--report=' + report,
                _PROGRAM, '--output_dir=' + folder, '--num_train_steps=4')
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    with open(report) as f:
      data = json.load(f)
    peak = re.search(r'peak training-step memory .*: ([\d.]+) MiB',
                     proc.stderr)
    self.assertIsNotNone(peak, proc.stderr[-2000:])
    self.assertAlmostEqual(data['peak_step_bytes'] / 2**20,
                           float(peak.group(1)), places=1)
    self.assertEqual(data['levers'], {'precision': 'bfloat16',
                                      'gradient_accumulation_steps': 2,
                                      'recompute': False})
    self.assertEqual(data['exit_code'], 0)
    self.assertIsNone(data['budget_bytes'])
    self.assertIsNone(data['planned_peak_bytes'])
    share = re.search(r'bfloat16 share of matmul/conv FLOPs: ([\d.]+)%',
                      proc.stderr)
    self.assertAlmostEqual(100 * data['bfloat16_flop_share'],
                           float(share.group(1)), places=1)

  def test_an_unwritable_report_is_one_line(self):
    proc = _cli('check', '--report=/nonexistent/dir/r.json', _PROGRAM,
                '--output_dir=' + self.create_tempdir().full_path)
    self.assertIn('estimator_bf16: error: --report /nonexistent/dir/r.json: '
                  'No such file or directory', proc.stderr)


if __name__ == '__main__':
  tf.test.main()
