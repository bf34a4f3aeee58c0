"""Fitting a batch to a budget: the table's choice on plans whose numbers are known."""

import dataclasses
import io
import json
import os
import re
import shutil
import tempfile
import textwrap
from unittest import mock

from absl.testing import parameterized
import pytest
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.memory import fit as fit_lib
from estimator_bf16.memory import planner
from estimator_bf16.memory import slots as slots_lib
from estimator_bf16.models import digits
from estimator_bf16.platform import cpu_bfloat16
from estimator_bf16.platform import tpu as tpu_facts
from estimator_bf16.precision import policy
from estimator_bf16.runner import fit_report
from tests.support import legacy_model
from tests.support import cli_refusal
from tests.platform import test_quiet
from tests.runner import test_runner

MiB = tpu_facts.MiB


def _plan(precision, per_example_mib, parameters_mib=100, slots_mib=200):
  """A plan with chosen numbers: persistent + per_example x batch."""
  per_example = per_example_mib * MiB
  return planner.MemoryPlan(
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
    result = fit_lib.fit(_PLANS, 64, 1024 * MiB)
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
    # No margin: the budgets above are set against the plans themselves.
    result = fit_lib.fit(_PLANS, 64, budget_mib * MiB, margin=0)
    chosen = result.chosen
    self.assertEqual((chosen.precision, chosen.gradient_accumulation_steps,
                      chosen.recompute), expected)
    self.assertLessEqual(chosen.planned_bytes, budget_mib * MiB)
    self.assertTrue(all(chosen.cost <= o.cost for o in result.options
                        if o.fits))

  def test_nothing_fits(self):
    result = fit_lib.fit(_PLANS, 64, 1 * MiB)
    self.assertIsNone(result.chosen)
    self.assertFalse(any(o.fits for o in result.options))
    lines = fit_report.model_parallel_lines(
        fit_lib.model_parallel(_PLANS[('bfloat16', True)], 1 * MiB))
    self.assertIn('num_cores_per_replica=2', '\n'.join(lines))
    self.assertIn('Adafactor', '\n'.join(lines))
    self.assertIn('input_partition_dims', '\n'.join(lines))

  def test_the_margin_is_kept_free(self):
    # bfloat16 alone plans 556 MiB: it fits 600 MiB with no margin, not
    # with 10% (611.6 MiB); then K=2 (528 MiB, 580.8 with the margin) does.
    self.assertEqual(
        fit_lib.fit(_PLANS, 64, 600 * MiB,
                    margin=0).chosen.gradient_accumulation_steps, 1)
    result = fit_lib.fit(_PLANS, 64, 600 * MiB)
    self.assertEqual(result.margin, fit_lib.PLAN_MARGIN)
    self.assertEqual(result.chosen.gradient_accumulation_steps, 2)
    self.assertLessEqual(result.chosen.planned_bytes * 1.1, 600 * MiB)
    for option in result.options:
      self.assertEqual(option.fits,
                       option.planned_bytes * 1.1 <= 600 * MiB, option)

  @parameterized.parameters(-0.1, '10%', True)
  def test_bad_margin(self, margin):
    with self.assertRaisesRegex(ValueError, 'margin'):
      fit_lib.fit(_PLANS, 64, 600 * MiB, margin=margin)

  def test_accumulation_left_out_where_it_cannot_apply(self):
    result = fit_lib.fit(_PLANS, 64, 420 * MiB, margin=0,
                         accumulation_note='use_tpu=True')
    self.assertEqual({o.gradient_accumulation_steps for o in result.options},
                     {1})
    # Without accumulation the cheapest fit is recompute (364 MiB).
    self.assertTrue(result.chosen.recompute)
    self.assertFalse(result.accumulation)
    self.assertEqual(result.accumulation_note, 'use_tpu=True')
    self.assertEqual(fit_report.note_lines(result),
                     ['No gradient accumulation: use_tpu=True.'])

  def test_a_recompute_that_cuts_nothing_is_no_option(self):
    plans = dict(_PLANS)
    plans[('bfloat16', True)] = dataclasses.replace(
        plans[('bfloat16', False)], recompute=True)
    result = fit_lib.fit(plans, 64, 420 * MiB, margin=0)
    self.assertFalse(any(o.recompute for o in result.options
                         if o.precision == 'bfloat16'))
    self.assertTrue(any(o.recompute for o in result.options
                        if o.precision == 'float32'))
    self.assertEqual(result.same_recompute, ('bfloat16',))
    self.assertEqual(fit_report.note_lines(result), [
        'No recompute in bfloat16: the network has too few ops to cut into '
        'segments, so it plans the same.'])

  def test_upcast_plans_the_cpu_copies(self):
    plan = _plan('bfloat16', 4)
    plan = planner.MemoryPlan(**dict(
        plan.__dict__, upcast_lines=((0.0, 6 * MiB),)))
    plans = {('bfloat16', False): plan}
    tpu = fit_lib.fit(plans, 64, 2000 * MiB)
    cpu = fit_lib.fit(plans, 64, 2000 * MiB, upcast=True)
    self.assertEqual(tpu.chosen.planned_bytes, (300 + 64 * 4) * MiB)
    self.assertEqual(cpu.chosen.planned_bytes, (300 + 64 * 6) * MiB)

  def test_table_stops_each_group_at_its_first_fit(self):
    result = fit_lib.fit(_PLANS, 64, 600 * MiB)
    lines = fit_report.table_lines(result)
    rows = [line for line in lines if re.match(r'^\*?\s+(float32|bfloat16)',
                                               line)]
    # float32 without recompute: K=1 and 2 do not fit (656 MiB + 10% for
    # K=2), K=4 (300 + 128 + 100 = 528 MiB, 580.8 with the margin) does;
    # the rest are one line.
    float32_rows = [r for r in rows if 'float32' in r and ' off ' in r]
    self.assertEqual([int(r.split()[1]) for r in float32_rows],
                     [1, 2, 4])
    self.assertIn('... and K = 8 to 64', '\n'.join(lines))
    self.assertLen([line for line in lines if line.startswith('*')], 1)

  def test_k2_above_k1_is_not_summed_up_as_fitting(self):
    # bfloat16 with recompute: K=1 plans 364 MiB; K=2 adds 100 MiB of
    # accumulators (432 MiB) and K=64 still 401: in 400 MiB only K=1 fits.
    result = fit_lib.fit(_PLANS, 64, 400 * MiB, margin=0)
    lines = fit_report.table_lines(result)
    rows = [l for l in lines if re.match(r'^\*?\s+bfloat16\s+\d+\s+\d+\s+on',
                                         l)]
    self.assertLen(rows, 7)
    self.assertEqual([r.split()[-1] for r in rows],
                     ['yes'] + ['no'] * 6)

  def test_one_example_over_the_budget_less_the_margin(self):
    # 950 MiB at one example: under 1000 MiB, over 1000 / 1.1.
    plans = {('bfloat16', False): _plan('bfloat16', 950, 0, 0)}
    result = fit_lib.fit(plans, 1, 1000 * MiB)
    self.assertIsNone(result.chosen)
    lines = fit_report.over_budget_lines(result)
    self.assertIn('Even one example per core needs 950.0 MiB with the '
                  'smallest plan, over the 1000.0 MiB budget less its 10% '
                  'margin (909.1 MiB).', lines)

  def test_over_budget_names_the_batch_when_one_example_fits(self):
    # 300 MiB persistent + 1 MiB an example (bfloat16 with recompute): at
    # 64 per core 364 MiB; in 350 MiB (318 with the margin) 18 fit.
    result = fit_lib.fit(_PLANS, 64, 350 * MiB, accumulation_note='TPU')
    self.assertIsNone(result.chosen)
    lines = fit_report.over_budget_lines(result)
    self.assertIn('It is the batch of 64 per core that does not fit: at most '
                  '18 per core fits, with bfloat16 + recompute', lines[0])
    self.assertNotIn('num_cores_per_replica', '\n'.join(lines))
    self.assertIn(('bfloat16 + recompute', 18),
                  fit_report.largest_batch_items(result))
    # 100 MiB: not even the weights fit; model parallelism is named.
    tiny = fit_lib.fit(_PLANS, 64, 100 * MiB)
    self.assertIn('num_cores_per_replica=2',
                  '\n'.join(fit_report.over_budget_lines(tiny)))

  def test_largest_batches_with_accumulation(self):
    result = fit_lib.fit(_PLANS, 64, 600 * MiB, margin=0)
    rows = dict(fit_report.largest_batch_items(result))
    # bfloat16: (600 - 300) / 4 = 75; with the 100 MiB of accumulators, 50
    # per micro-batch.
    self.assertEqual(rows['bfloat16'], 75)
    self.assertEqual(rows['bfloat16 + accumulation'], 'K x 50')
    self.assertEqual(rows['float32 + recompute'], 150)

  def test_report_names_the_choice(self):
    result = fit_lib.fit(_PLANS, 64, 600 * MiB, margin=0)
    report = fit_report.report_dict(result)
    self.assertEqual(report['levers'], {'precision': 'bfloat16',
                                        'gradient_accumulation_steps': 1,
                                        'recompute': False})
    self.assertEqual(report['planned_peak_bytes'], (300 + 256) * MiB)
    self.assertEqual(report['budget_bytes'], 600 * MiB)
    marked = [line for line in fit_report.table_lines(result)
              if line.startswith('*')]
    self.assertLen(marked, 1)

  @parameterized.parameters(('8589934592', 8 * 2**30), ('512MiB', 512 * MiB),
                            ('8GiB', 8 * 2**30), ('1.5GB', 1500000000),
                            (' 2 KiB ', 2048))
  def test_sizes(self, text, expected):
    self.assertEqual(fit_lib.parse_size(text), expected)

  @parameterized.parameters('8 gigs', '', '-1MiB', '0', 'MiB')
  def test_bad_sizes(self, text):
    with self.assertRaisesRegex(ValueError, 'size'):
      fit_lib.parse_size(text)

  def test_devices(self):
    self.assertEqual(fit_lib.device_bytes('tpu-v2'), 8 * 2**30)
    self.assertEqual(fit_lib.device_bytes('tpu-v3'), 16 * 2**30)
    with self.assertRaisesRegex(ValueError, 'tpu-v2, tpu-v3, tpu-v4'):
      fit_lib.device_bytes('tpu-v9')

  @parameterized.parameters(0, -4, 2.5, True)
  def test_bad_batch(self, batch):
    with self.assertRaisesRegex(ValueError, 'batch_per_core'):
      fit_lib.fit(_PLANS, batch, 600 * MiB)


class SlotBytesTest(tf.test.TestCase):
  """Optimizer slots counted from the variables' shapes (`memory.slots`)."""

  _SHAPES = [('kernel', [3, 3, 8, 16]), ('bias', [16]), ('dense', [64, 10])]
  _PARAMETERS = 3 * 3 * 8 * 16 + 16 + 64 * 10  # 1808

  def test_slot_bytes_per_optimizer(self):
    # Adam: m and v, float32, the size of every parameter.
    self.assertEqual(slots_lib.adam_slot_bytes(self._SHAPES),
                     2 * 4 * self._PARAMETERS)
    self.assertEqual(slots_lib.slot_bytes('adam', self._SHAPES), 14464)
    # Adafactor: rows (shape without the last dim) + columns (without the
    # second last) of each matrix; vectors keep their own size.
    factored = (3 * 3 * 8 + 3 * 3 * 16) + 16 + (64 + 10)
    self.assertEqual(slots_lib.adafactor_slot_bytes(self._SHAPES), 4 * factored)
    self.assertEqual(slots_lib.slot_bytes('adafactor', self._SHAPES), 1224)
    with self.assertRaisesRegex(ValueError, 'adam, adafactor'):
      slots_lib.slot_bytes('rmsprop', self._SHAPES)

  def test_optimizer_plan_counts_the_accumulators_as_slots(self):
    plan = _plan('bfloat16', 4)
    adam = slots_lib.optimizer_plan(plan, 'adam', self._SHAPES)
    self.assertEqual((adam.optimizer, adam.slot_bytes), ('adam', 14464))
    self.assertEqual(adam.lines, plan.lines)
    accumulated = slots_lib.optimizer_plan(
        dataclasses.replace(plan, gradient_accumulation_steps=4), 'adafactor',
        self._SHAPES)
    self.assertEqual(accumulated.slot_bytes, 1224 + 100 * MiB)


class FitOrderTest(tf.test.TestCase):
  """The one order of plans and options, and the data the text is made of."""

  def test_plans_are_ordered_by_precision_then_lever(self):
    keys = [('bfloat16', True), ('float32', True), ('bfloat16', False),
            ('float32', False)]
    self.assertEqual(sorted(keys, key=fit_lib.plan_order), [('float32', False),
                                                            ('float32', True),
                                                            ('bfloat16', False),
                                                            ('bfloat16', True)])
    plans = {('bfloat16', 'adam'): 1, ('float32', 'adam'): 2,
             ('float32', 'adafactor'): 3}
    self.assertEqual([key for key, _ in fit_lib.sorted_plans(plans)],
                     [('float32', 'adafactor'), ('float32', 'adam'),
                      ('bfloat16', 'adam')])
    with self.assertRaisesRegex(ValueError, 'precision'):
      fit_lib.plan_order(('float16', False))

  def test_options_are_in_table_order(self):
    # Given in another order, planned in plan order, K ascending.
    plans = dict(reversed(list(_PLANS.items())))
    result = fit_lib.fit(plans, 4, 1024 * MiB)
    self.assertEqual(
        [(o.precision, o.recompute, o.gradient_accumulation_steps)
         for o in result.options],
        [('float32', False, 1), ('float32', False, 2), ('float32', False, 4),
         ('float32', True, 1), ('float32', True, 2), ('float32', True, 4),
         ('bfloat16', False, 1), ('bfloat16', False, 2),
         ('bfloat16', False, 4), ('bfloat16', True, 1),
         ('bfloat16', True, 2), ('bfloat16', True, 4)])
    self.assertIsInstance(result.options[0].precision, policy.Precision)
    self.assertEqual([o.cost for o in result.options[::3]],
                     [1.7, 1.7 * 1.2, 1.0, 1.2])

  def test_choice_key_ranks_cost_then_fewest_levers(self):
    result = fit_lib.fit(_PLANS, 64, 600 * MiB, margin=0)
    ranked = sorted((o for o in result.options if o.fits),
                    key=fit_lib.choice_key)
    self.assertEqual(ranked[0], result.chosen)
    self.assertEqual(
        [(o.precision, o.gradient_accumulation_steps, o.recompute)
         for o in ranked[:8]],
        [('bfloat16', 1, False), ('bfloat16', 2, False),
         ('bfloat16', 4, False), ('bfloat16', 8, False),
         ('bfloat16', 16, False), ('bfloat16', 32, False),
         ('bfloat16', 64, False), ('bfloat16', 1, True)])
    self.assertEqual(ranked[-1].precision, 'float32')

  def test_table_groups(self):
    groups = fit_lib.table_groups(fit_lib.fit(_PLANS, 64, 600 * MiB))
    self.assertLen(groups, 4)
    self.assertEqual(
        [o.gradient_accumulation_steps for o in groups[0].shown], [1, 2, 4])
    self.assertEqual(
        [o.gradient_accumulation_steps for o in groups[0].also_fit],
        [8, 16, 32, 64])
    # In 400 MiB only K=1 of bfloat16 with recompute fits: every row shown.
    tight = fit_lib.table_groups(fit_lib.fit(_PLANS, 64, 400 * MiB, margin=0))
    self.assertLen(tight[3].shown, 7)
    self.assertEqual(tight[3].also_fit, ())

  def test_largest_batches_and_smallest_option(self):
    result = fit_lib.fit(_PLANS, 64, 600 * MiB, margin=0)
    rows = fit_lib.largest_batches(result)
    self.assertEqual(rows[:2], [
        fit_lib.LargestBatch('float32', False, False, 37),
        fit_lib.LargestBatch('float32', False, True, 25)
    ])
    self.assertIn(fit_lib.LargestBatch('bfloat16', False, True, 50), rows)
    self.assertLen(rows, 8)
    smallest = fit_lib.smallest_option(fit_lib.fit(_PLANS, 64, 1 * MiB))
    self.assertEqual((smallest.precision, smallest.gradient_accumulation_steps,
                      smallest.recompute, smallest.planned_bytes),
                     ('bfloat16', 1, True, 364 * MiB))

  def test_over_budget(self):
    advice = fit_lib.over_budget(
        fit_lib.fit(_PLANS, 64, 350 * MiB, accumulation_note='TPU'))
    self.assertEqual(
        advice,
        fit_lib.BatchOverBudget(batch_per_core=64, largest_batch=18,
                                precision='bfloat16', recompute=True))
    advice = fit_lib.over_budget(fit_lib.fit(_PLANS, 64, 100 * MiB))
    self.assertIsInstance(advice, fit_lib.ModelParallel)
    # bfloat16 with recompute: 300 MiB persistent + 1 MiB an example.
    self.assertEqual(advice.one_example_bytes, 301 * MiB)
    self.assertEqual(advice.per_core_bytes, ((2, 150.5 * MiB),
                                             (4, 75.25 * MiB),
                                             (8, 37.625 * MiB)))
    self.assertTrue(advice.state_over_budget)
    self.assertAlmostEqual(advice.room_bytes, 100 * MiB / 1.1)
    self.assertFalse(advice.image_input)


@pytest.mark.slow
class ChooseLeversTest(tf.test.TestCase):
  """The library entry point on a real model_fn."""

  def test_a_tight_budget_gets_a_lever_beyond_bfloat16(self):
    features, labels = planner.input_specs(legacy_model.train_input_fn)
    plain = planner.memory_plan(
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


_PROGRAM = 'models/tf1/bert_style/tf1_run_classifier.py'

# A TF 1.x TPUEstimator text program much smaller than the bert-style one:
# planning its 4 lever combinations costs a second, not ten. Eight layers on
# [batch, tokens, 64] activations: recompute has ops to cut, and in 1 MiB
# bfloat16 needs accumulation (K=2) while 100 KiB holds not even the
# weights. It takes its model_dir as argv[1] and says when it trained.
_TEXT_PROGRAM = textwrap.dedent('''\
    import sys

    import tensorflow as tf

    VOCAB, LENGTH, WIDTH, LAYERS = 64, 16, 64, 8


    def input_fn(params):
      ids = tf.random.stateless_uniform([256, LENGTH], [1, 2], maxval=VOCAB,
                                        dtype=tf.int32)
      labels = tf.cast(tf.reduce_sum(ids, axis=1) > VOCAB * LENGTH // 2,
                       tf.int32)
      return tf.data.Dataset.from_tensor_slices(({'ids': ids}, labels)).repeat(
          ).batch(params['batch_size'], drop_remainder=True)


    def model_fn(features, labels, mode, params):
      del params
      table = tf.compat.v1.get_variable('embedding', [VOCAB, 16])
      net = tf.gather(table, features['ids'])
      for i in range(LAYERS):
        net = tf.compat.v1.layers.dense(net, WIDTH, tf.nn.relu,
                                        name='dense_%d' % i)
      logits = tf.compat.v1.layers.dense(tf.reduce_mean(net, axis=1), 2,
                                         name='logits')
      loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
      train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(
          loss, global_step=tf.compat.v1.train.get_global_step())
      return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss,
                                                         train_op=train_op)


    estimator = tf.compat.v1.estimator.tpu.TPUEstimator(
        model_fn=model_fn, use_tpu=False, train_batch_size=32,
        config=tf.compat.v1.estimator.tpu.RunConfig(model_dir=sys.argv[1]))
    # `--memory` measures the 4th session run of a train call.
    estimator.train(input_fn, max_steps=4)
    print('the program trained')
    ''')


def _cli(*args):
  """The command in this process: its report and exit code are the point."""
  return test_runner._cli_here(*args)  # pylint: disable=protected-access


def _text_program(test):
  """Writes _TEXT_PROGRAM to a temporary folder: (program, model_dir)."""
  folder = test.create_tempdir().full_path
  program = os.path.join(folder, 'text_program.py')
  with open(program, 'w') as f:
    f.write(_TEXT_PROGRAM)
  return program, os.path.join(folder, 'model')


@pytest.mark.slow
class CheckFitCommandTest(tf.test.TestCase, parameterized.TestCase):
  """`check --fit` on the small text program (batch 32)."""

  def _check_fit(self, budget):
    """`check --fit --memory_budget=budget --report`: (process, JSON)."""
    report = os.path.join(self.create_tempdir().full_path, 'fit.json')
    program, model_dir = _text_program(self)
    proc = _cli('check', '--fit', '--memory_budget=' + budget,
                '--report=' + report, program, model_dir)
    with open(report) as f:
      return proc, json.load(f)

  def test_the_choice_and_its_json_agree(self):
    proc, data = self._check_fit('1MiB')
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    chosen = re.search(r'^chosen: (.*), planned ([\d.]+) MiB of ([\d.]+) MiB',
                       proc.stderr, re.M)
    self.assertIsNotNone(chosen, proc.stderr)
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
    proc, data = self._check_fit('100KiB')
    self.assertEqual(proc.returncode, 1, proc.stderr[-3000:])
    self.assertIn('nothing fits', proc.stderr)
    self.assertIn('Even one example per core needs', proc.stderr)
    self.assertIn('num_cores_per_replica=2', proc.stderr)
    # A text model: no spatial partitioning advice.
    self.assertNotIn('input_partition_dims', proc.stderr)
    self.assertIn('result: FAILED', proc.stderr)
    self.assertEqual(data['exit_code'], 1)
    self.assertIsNone(data['fit']['levers'])
    self.assertIsNone(data['planned_peak_bytes'])

  @parameterized.parameters('check', 'run')
  def test_a_plan_that_cannot_be_made_fails_the_fit(self, command):
    # A plain Estimator whose input_fn batches without drop_remainder: no
    # static batch to fit.
    folder = self.create_tempdir().full_path
    program = os.path.join(folder, 'plain_estimator.py')
    with open(program, 'w') as f:
      f.write(test_quiet._PROGRAM)  # pylint: disable=protected-access
    proc = _cli(command, '--fit', '--memory_budget=1GiB', program,
                os.path.join(folder, 'model'))
    self.assertEqual(proc.returncode, 1, proc.stderr[-3000:])
    output = proc.stderr
    self.assertIn('no static batch size to fit', output)
    self.assertIn('result: FAILED', output)
    self.assertIsNone(tf.train.latest_checkpoint(os.path.join(folder,
                                                              'model')))


@pytest.mark.slow
class CheckFitOnTpuCommandTest(tf.test.TestCase):
  """One `check --fit --device=tpu-v2 --precision=float32` of the bert-style
  TF 1.x program at batch 32, read by each test; its --report names a
  folder that does not exist."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._output = tempfile.mkdtemp()
    cls._proc = _cli('check', '--fit', '--device=tpu-v2',
                     '--precision=float32',
                     '--report=/nonexistent/dir/r.json', _PROGRAM,
                     '--output_dir=' + cls._output, '--train_batch_size=32')

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls._output, ignore_errors=True)
    super().tearDownClass()

  def test_precision_float32_wins_over_the_fit(self):
    proc = self._proc
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    rows = [line for line in proc.stderr.splitlines()
            if re.match(r'^\*?\s+(float32|bfloat16)\s+\d', line)]
    self.assertNotEmpty(rows)
    self.assertTrue(all('float32' in row for row in rows), rows)
    # A TPU core's budget plans accumulation too: the device loop runs the
    # micro-batches inside each step.
    self.assertIn('float32 + accumulation K x ', proc.stderr)
    self.assertRegex(proc.stderr, r'\.\.\. and K = 2 to 32 .* also fit')
    self.assertNotIn('No gradient accumulation', proc.stderr)

  def test_a_batch_too_large_for_one_core_is_said_so(self):
    self.assertIn('largest batch per core in 8192 MiB: float32 ',
                  self._proc.stderr)
    self.assertIn('A v2-8 / v3-8 board has 8 cores', self._proc.stderr)

  def test_an_unwritable_report_is_one_line(self):
    # The check itself passed; only the report could not be written.
    self.assertEqual(self._proc.returncode, 0, self._proc.stderr[-3000:])
    self.assertIn('estimator_bf16: error: --report /nonexistent/dir/r.json: '
                  'No such file or directory', self._proc.stderr)
    self.assertNotIn('Traceback', self._proc.stderr)


class FitCommandLineTest(tf.test.TestCase, parameterized.TestCase):
  """Bad --fit input returns 2 before the program starts: `cli.main` here,
  as `python -m estimator_bf16` returns it (tests/runner/test_runner.py
  `CommandLineTest`)."""

  @parameterized.named_parameters(
      ('check_unknown_device', 'check', ['--fit', '--device=tpu-v9'],
       'tpu-v2, tpu-v3'),
      ('check_budget_not_a_size', 'check', ['--fit', '--memory_budget=lots'],
       'is not a size'),
      ('check_fit_with_accumulate', 'check',
       ['--fit', '--device=tpu-v2', '--accumulate=2'], 'chooses --accumulate'),
      ('check_no_target', 'check', ['--fit'], 'exactly one of --device'),
      ('check_device_without_fit', 'check', ['--device=tpu-v2'],
       'go with --fit'),
      ('run_unknown_device', 'run', ['--fit', '--device=tpu-v9'],
       'tpu-v2, tpu-v3'),
      ('run_budget_not_a_size', 'run', ['--fit', '--memory_budget=lots'],
       'is not a size'),
      ('run_fit_with_accumulate', 'run',
       ['--fit', '--device=tpu-v2', '--accumulate=2'], 'chooses --accumulate'),
      ('run_fit_with_recompute', 'run',
       ['--fit', '--device=tpu-v2', '--recompute'],
       'chooses --accumulate and --recompute'),
      ('run_budget_without_fit', 'run', ['--memory_budget=1GiB'],
       'go with --fit'))
  def test_bad_input_exits_2_before_running(self, command, args, message):
    from estimator_bf16.apps import cli  # pylint: disable=g-import-not-at-top
    code, stderr = cli_refusal.refused([command, *args, _PROGRAM])
    self.assertEqual(code, cli.EXIT_USAGE)
    self.assertIn(message, stderr)
    self.assertNotIn('Traceback', stderr)


def _measured(stderr, name):
  """MiB of a 'peak training-step NAME ...: X MiB' line of a run report."""
  match = re.search(r'^peak training-step %s .*: ([\d.]+) MiB$' % name,
                    stderr, re.M)
  return float(match.group(1)) if match else None


@pytest.mark.slow
class RunFitCommandTest(tf.test.TestCase, parameterized.TestCase):
  """`run --fit` on models/mnist_tpu.py at batch 1024 and on the small TF 1.x
  text program: the budget is 60% of the step's measured bfloat16 peak.

  Four steps: `--memory` traces the 4th session run of a train call. The
  BERT-style program's plan against its measured step, under each lever,
  is test_planner's `MeasuredPeakTest`; its `run --fit` runs as
  docs/runner.md shows it (tests/test_docs_commands.py).
  """

  def _program(self, name, data):
    """Command-line arguments of a fresh run of `name`."""
    folder = self.create_tempdir().full_path
    if name == 'mnist':
      return ['models/mnist_tpu.py', '--use_tpu=false', '--data_dir=' + data,
              '--model_dir=' + os.path.join(folder, 'model'),
              '--batch_size=1024', '--train_steps=4', '--iterations=4',
              '--eval_steps=0']
    return list(_text_program(self))

  @parameterized.parameters('mnist', 'text')
  def test_stays_within_60_percent_of_the_plain_peak(self, name):
    # The digits both runs of mnist read (the text program makes its own
    # examples).
    data_dir = self.create_tempdir().full_path
    if name == 'mnist':
      digits.write_digits(data_dir)
    program = self._program(name, data_dir)
    # The text program runs in this process: the commands' report is the
    # point, not their process, and the measured step runs one op at a
    # time whatever ran here before (memory.peak.traced_run_options).
    # mnist_tpu.py calls tf.disable_v2_behavior(), so it gets processes.
    cli = test_runner._cli if name == 'mnist' else _cli  # pylint: disable=protected-access
    plain = cli('run', '--memory', *program)
    self.assertEqual(plain.returncode, 0, plain.stderr[-3000:])
    plain_mib = _measured(plain.stderr, 'tensors')
    self.assertIsNotNone(plain_mib, plain.stderr[-2000:])
    budget = int(0.6 * plain_mib * MiB)
    report = os.path.join(self.create_tempdir().full_path, 'fit.json')
    program = self._program(name, data_dir)
    proc = cli('run', '--fit', '--memory_budget=%d' % budget, '--seed=3',
               '--report=' + report, *program)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    stderr = proc.stderr
    with open(report) as f:
      data = json.load(f)
    self.assertEqual(data['seed'], 3)  # --seed reaches the fitted run
    levers = data['levers']
    self.assertEqual(levers['precision'], 'bfloat16')
    # A lever beyond bfloat16 was needed, and applied.
    self.assertTrue(levers['gradient_accumulation_steps'] > 1 or
                    levers['recompute'], levers)
    self.assertIn('memory levers: ' + (
        'gradient accumulation K=%d' % levers['gradient_accumulation_steps']
        if levers['gradient_accumulation_steps'] > 1 else 'recompute on'),
                  stderr)
    # Measured within the budget; the plan within the planner's margin.
    self.assertEqual(data['budget_bytes'], budget)
    self.assertLessEqual(data['peak_step_bytes'], budget)
    self.assertLessEqual(data['planned_peak_bytes'] * (1 + fit_lib.PLAN_MARGIN),
                         budget)
    # Where bfloat16 is emulated, the plan adds the float32 copies of the
    # CPU's matmuls and substituted ops (`upcast`), a coarser model (fit
    # keeps EMULATED_PLAN_MARGIN for it). Measured with
    # TF_ENABLE_ONEDNN_OPTS=0: plan / measured 0.84 for mnist (whose step
    # peaks at 239 MiB with substitution, 236 MiB with TensorFlow's own
    # bfloat16 kernels) and 0.93 for the text program (0.91 with native
    # kernels).
    spread = 0.25 if cpu_bfloat16.emulated_kernels() else 0.15
    self.assertBetween(data['planned_peak_bytes'] / data['peak_step_bytes'],
                       1 - spread, 1 + spread)
    # The printed figures are the JSON's.
    line = re.search(r'^peak step tensors: measured ([\d.]+) MiB \| planned '
                     r'([\d.]+) MiB \| budget ([\d.]+) MiB: within the '
                     r'budget$', stderr, re.M)
    self.assertIsNotNone(line, stderr[-3000:])
    for value, key in zip(line.groups(), ('peak_step_bytes',
                                          'planned_peak_bytes',
                                          'budget_bytes')):
      self.assertAlmostEqual(float(value), data[key] / MiB, places=1)
    self.assertEqual(_measured(stderr, 'tensors'),
                     round(data['peak_step_bytes'] / MiB, 1))


@pytest.mark.slow
class RunFitChoiceCommandTest(tf.test.TestCase):
  """`run --fit` where its choice, not the measured peak, is the point: on
  the small text program."""

  def test_nothing_fits_trains_nothing(self):
    program, model_dir = _text_program(self)
    proc = _cli('run', '--fit', '--memory_budget=100KiB', program, model_dir)
    self.assertEqual(proc.returncode, 1, proc.stderr[-3000:])
    self.assertIn('nothing fits', proc.stderr)
    self.assertIn('num_cores_per_replica=2', proc.stderr)
    self.assertIn('\nestimator_bf16 run --fit (planning, nothing trained): ',
                  proc.stderr)
    self.assertNotIn('estimator_bf16 check:', proc.stderr)
    self.assertNotIn('the program trained', proc.stdout)
    self.assertIsNone(tf.train.latest_checkpoint(model_dir))

  def test_precision_float32_wins_over_the_fit(self):
    program, model_dir = _text_program(self)
    proc = _cli('run', '--fit', '--memory_budget=1GiB', '--precision=float32',
                program, model_dir)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn('\nprecision: float32\n', proc.stderr)
    self.assertIn('fit: float32, chosen for 1024.0 MiB', proc.stderr)
    self.assertIn('the program trained', proc.stdout)


class FitPrecisionsTest(tf.test.TestCase, parameterized.TestCase):
  """Which precisions `--fit` plans: both unless `--precision` is given."""

  @parameterized.parameters(
      ('check', (), ('float32', 'bfloat16')),
      ('run', (), ('float32', 'bfloat16')),
      ('check', ('--precision=bfloat16',), ('bfloat16',)),
      ('run', ('--precision=bfloat16',), ('bfloat16',)),
      ('check', ('--precision=float32',), ('float32',)),
      ('run', ('--precision=float32',), ('float32',)))
  def test_planned_precisions(self, command, flags, expected):
    from estimator_bf16.apps import cli  # pylint: disable=g-import-not-at-top
    from estimator_bf16.runner import program as runner  # pylint: disable=g-import-not-at-top
    planned = []

    def check_program(program, program_args, plan_fn=None, **kwargs):
      del program, program_args, kwargs
      planned.append(plan_fn.keywords['precisions'])
      raise KeyboardInterrupt()

    def run_fit(args, budget, precisions, exclude):
      del args, budget, exclude
      planned.append(precisions)
      return 0

    with mock.patch.object(runner, 'run_program', check_program), \
        mock.patch.object(cli, '_run_fit', run_fit), \
        mock.patch('sys.stderr', new_callable=io.StringIO):
      cli.main([command, '--fit', '--memory_budget=1GiB'] + list(flags) +
               [_PROGRAM])
    self.assertLen(planned, 1)
    self.assertEqual(tuple(str(p) for p in planned[0]), expected)


class CtrlCWhilePlanningTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters('check', 'run')
  def test_one_line_and_exit_130(self, command):
    from estimator_bf16.apps import cli  # pylint: disable=g-import-not-at-top
    from estimator_bf16.runner import program as runner  # pylint: disable=g-import-not-at-top

    def interrupted(*args, **kwargs):
      del args, kwargs
      raise KeyboardInterrupt()

    with mock.patch.object(runner, 'run_program', interrupted), \
        mock.patch('sys.stderr', new_callable=io.StringIO) as stderr:
      code = cli.main([command, '--fit', '--memory_budget=1GiB', _PROGRAM])
    self.assertEqual(code, 130)
    self.assertEqual(stderr.getvalue(), 'estimator_bf16: stopped by Ctrl-C '
                     'while planning; nothing was trained.\n')


class RunReportTest(tf.test.TestCase):

  @pytest.mark.slow
  def test_run_report_json_matches_the_printed_report(self):
    folder = self.create_tempdir().full_path
    report = os.path.join(folder, 'run.json')
    program, model_dir = _text_program(self)
    proc = _cli('run', '--memory', '--accumulate=2', '--report=' + report,
                program, model_dir)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    with open(report) as f:
      data = json.load(f)
    allocator = re.search(r'peak training-step memory .*: ([\d.]+) MiB',
                          proc.stderr)
    tensors = re.search(r'peak training-step tensors .*: ([\d.]+) MiB',
                        proc.stderr)
    self.assertIsNotNone(allocator, proc.stderr[-2000:])
    self.assertIsNotNone(tensors, proc.stderr[-2000:])
    # The report prints one decimal: the exact figure is within half of
    # its last digit (1.25 MiB prints as 1.2).
    half_digit = 0.05 + 1e-9
    self.assertAlmostEqual(data['peak_allocator_bytes'] / 2**20,
                           float(allocator.group(1)), delta=half_digit)
    self.assertAlmostEqual(data['peak_step_bytes'] / 2**20,
                           float(tensors.group(1)), delta=half_digit)
    self.assertEqual(data['levers'], {'precision': 'bfloat16',
                                      'gradient_accumulation_steps': 2,
                                      'recompute': False,
                                      'kernels': 'auto'})
    self.assertEqual(data['exit_code'], 0)
    self.assertIsNone(data['budget_bytes'])
    self.assertIsNone(data['planned_peak_bytes'])
    share = re.search(r'bfloat16 share of matmul/conv FLOPs: ([\d.]+)%',
                      proc.stderr)
    self.assertAlmostEqual(100 * data['bfloat16_flop_share'],
                           float(share.group(1)), places=1)


if __name__ == '__main__':
  tf.test.main()
