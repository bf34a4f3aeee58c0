"""Convergence parity: the same training run in float32 and in bfloat16.

Runs go through the whole user path, `estimator_bf16.apps.training.run` (TPUEstimator in
local mode, `eb.make_tpu_estimator`, the real input pipelines), with the
same seed in both precisions: the MNIST MLP on the shipped digits and a
small BERT on the synthetic marker task. The loss curves come from the
`train/loss` summaries the head's host_call wrote; the eval metrics from the
Estimator's evaluation.
"""

import os
import shutil

from estimator_bf16.apps import precision_comparison
from estimator_bf16.apps import training
from estimator_bf16.precision import policy

# The synthetic marker task: short sequences and a larger batch and rate
# than the CLI's smoke defaults, so a small BERT learns it within a few
# hundred steps on a CPU.
_BERT = dict(seq_length=32, train_batch_size=32, eval_batch_size=32,
             eval_steps=8, learning_rate=1e-3, optimizer='adam',
             weight_decay=0.0)


def _one_run(options, model_dir):
  shutil.rmtree(model_dir, ignore_errors=True)
  result = training.run(options)
  steps, losses = precision_comparison.read_scalars(model_dir)
  tail = max(1, len(losses) // 10)
  return {
      'eval_accuracy': result['eval'].get('accuracy'),
      'eval_loss': result['eval'].get('loss'),
      'final_train_loss': float(losses[-tail:].mean()) if len(losses) else None,
      'train_seconds': result['train_seconds'],
      'loss_curve': {'steps': [int(s) for s in steps],
                     'loss': [float(v) for v in losses]},
  }


def _options(model, precision, model_dir, steps, bert_preset):
  # Summaries every step give the curves; no export, no extra checkpoints.
  common = dict(model_dir=model_dir, precision=precision, train_steps=steps,
                seed=0, export=False, log_every_steps=max(steps, 1),
                save_checkpoints_steps=steps)
  if model == 'mnist_mlp':
    return training.TrainOptions(model='mnist_mlp', **common)
  return training.TrainOptions(model='bert', bert_preset=bert_preset,
                               **dict(_BERT, **common))


def convergence_runs(out_dir, *, mnist_steps, bert_steps, bert_preset):
  """Trains each task in both precisions; returns the comparison.

  Args:
    out_dir: model directories go under `out_dir/convergence/`.
    mnist_steps: training steps of the MLP on the digits.
    bert_steps: training steps of BERT on the synthetic task.
    bert_preset: BERT size ('tiny', 'mini', ...).

  Returns:
    dict {task: {'float32': run, 'bfloat16': run, 'accuracy_difference':
    bf16 minus fp32 eval accuracy, 'eval_loss_ratio': bf16 over fp32}},
    each run holding eval accuracy and loss, the final training loss (mean
    of the last 10% of steps), seconds and the loss curve.
  """
  results = {}
  tasks = (('mnist_mlp', 'mnist_mlp', mnist_steps),
           ('bert_%s_synthetic' % bert_preset, 'bert', bert_steps))
  for task, model, steps in tasks:
    runs = {}
    for precision in policy.PRECISIONS:
      model_dir = os.path.join(out_dir, 'convergence', task, precision)
      runs[precision] = _one_run(
          _options(model, precision, model_dir, steps, bert_preset),
          model_dir)
    fp32, bf16 = runs['float32'], runs['bfloat16']
    runs['steps'] = steps
    runs['accuracy_difference'] = (
        bf16['eval_accuracy'] - fp32['eval_accuracy']
        if None not in (bf16['eval_accuracy'], fp32['eval_accuracy'])
        else None)
    runs['eval_loss_ratio'] = (bf16['eval_loss'] / fp32['eval_loss']
                               if fp32['eval_loss'] else None)
    results[task] = runs
  return results
