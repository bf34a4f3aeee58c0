"""Model families and data sets by name: defaults, files and how to build.

Each model family is one `Family` entry of `FAMILIES` (its data sets, its
defaults and its build function) and each data set one `Dataset` entry of
`DATA` (the sizes it implies, its files in --data_dir and the size of its
eval split), so adding a model or a data set is one edit. The views callers
read are derived from them: `MODELS`, `DATASETS[model]` (the family's data
sets, the built-in one first) and `DEFAULTS[model]`; `defaults(model,
dataset)` merges a family's defaults with the sizes its data set implies.
`build(options)` returns the model_fn, input fns and serving input fn of one
run.
"""

import dataclasses
import functools
import os
from typing import Any, Callable, Dict, Optional, Tuple

import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.models import bert
from estimator_bf16.models import bert_input
from estimator_bf16.models import digits
from estimator_bf16.models import head
from estimator_bf16.models import imagenet_input
from estimator_bf16.models import mnist
from estimator_bf16.models import mnist_input
from estimator_bf16.models import records
from estimator_bf16.models import resnet


@dataclasses.dataclass(frozen=True)
class Model:
  """What `training.run` needs for one model, data set and precision.

  Attributes:
    model_fn: legacy `model_fn(features, labels, mode, params, config)`.
    train_input_fn: `input_fn(params)`, endless.
    eval_input_fn: `input_fn(params)`.
    serving_input_fn: a `ServingInputReceiver` fn with float32 images or
      int32 ids, whatever the precision.
    config: the network config, for logs.
    skipped: with --skip_corrupt_records on real data, the tally of the
      damaged files the input fns skipped; else None.
  """
  model_fn: Callable
  train_input_fn: Callable
  eval_input_fn: Callable
  serving_input_fn: Callable
  config: Any
  skipped: Optional[records.SkippedFiles] = None


@dataclasses.dataclass(frozen=True)
class Dataset:
  """One data set a family can read (--dataset).

  Attributes:
    name: the --dataset value.
    defaults: option values the data set implies; they win over the
      family's defaults, and flags win over both.
    files: (train pattern, eval pattern) inside --data_dir of a real data
      set; None for one built in (generated or cached, no --data_dir).
    eval_examples: examples the eval split yields once through; None when
      unknown, and then --eval_steps decides.
  """
  name: str
  defaults: Dict[str, Any] = dataclasses.field(default_factory=dict)
  files: Optional[Tuple[str, str]] = None
  eval_examples: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class Family:
  """One model family (--model).

  Attributes:
    name: the --model value.
    datasets: names of the `DATA` entries it reads, the built-in one (needs
      no --data_dir) first.
    defaults: the value of every model option left unset (None).
    build: `build(options)` -> `Model`, from resolved `TrainOptions`.
  """
  name: str
  datasets: Tuple[str, ...]
  defaults: Dict[str, Any]
  build: Callable[[Any], Model]


def _by_name(*entries):
  return {entry.name: entry for entry in entries}


# What a data set implies. Synthetic streams never end, so eval needs a
# step count; a real set implies real sizes, while optimisation flags
# (learning rate, steps, batch) keep the family's small defaults: pass them
# for a real run. Eval sizes are None where synthetic data never ends or
# the files vary (run_classifier), so --eval_steps decides.
DATA = _by_name(
    Dataset('digits', eval_examples=digits.NUM_TEST),
    Dataset('mnist', files=(mnist_input.TRAIN_FILE, mnist_input.TEST_FILE),
            eval_examples=10000),
    Dataset('synthetic', defaults=dict(eval_steps=4)),
    Dataset('imagenet',
            defaults=dict(resnet_depth=50, image_size=224, num_classes=1000),
            files=('train-*', 'validation-*'), eval_examples=50000),
    Dataset('run_classifier',
            defaults=dict(bert_preset='base', seq_length=128,
                          vocab_size=30522),
            files=('train.tf_record', 'eval.tf_record')),
)


def data_files(dataset, data_dir):
  """Returns (train pattern, eval pattern) of a real data set in data_dir."""
  train, evaluation = DATA[dataset].files
  return os.path.join(data_dir, train), os.path.join(data_dir, evaluation)


def eval_examples(dataset):
  """Returns the size of a data set's eval split, or None if unknown."""
  return DATA[dataset].eval_examples if dataset in DATA else None


def image_serving_input_fn(image_size, channels):
  """Returns a serving input fn taking float32 [None, size, size, channels].

  Serving clients send float32 whatever the training precision: the wrapped
  model_fn casts to bfloat16 inside the graph.
  """

  def serving_input_fn():
    image = tf.compat.v1.placeholder(
        tf.float32, [None, image_size, image_size, channels], name='image')
    return tf.estimator.export.ServingInputReceiver({'image': image},
                                                    {'image': image})

  return serving_input_fn


def ids_serving_input_fn(seq_length):
  """Returns a serving input fn taking int32 BERT ids, mask and segments."""

  def serving_input_fn():
    # int32: what TPUs take, and ids must never be cast to a float type.
    features = {key: tf.compat.v1.placeholder(tf.int32, [None, seq_length],
                                              name=key)
                for key in ('input_ids', 'input_mask', 'segment_ids')}
    return tf.estimator.export.ServingInputReceiver(features, features)

  return serving_input_fn


def _head(options, network_fn_builder, **kwargs):
  return head.classifier_model_fn_builder(
      network_fn_builder, num_classes=options.num_classes,
      optimizer=options.optimizer, learning_rate=options.learning_rate,
      weight_decay=options.weight_decay, warmup_steps=options.warmup_steps,
      summary_dir=options.model_dir, **kwargs)


def _skipping(options):
  """Reader arguments for --skip_corrupt_records, and the shared tally."""
  skipped = records.SkippedFiles() if options.skip_corrupt_records else None
  return dict(skip_corrupt=options.skip_corrupt_records,
              skipped=skipped), skipped


def _mnist(options, network):
  """Builds `network` (`mnist.mnist_mlp` or `mnist.mnist_cnn`)."""
  config = mnist.MnistConfig(image_size=options.image_size,
                             num_classes=options.num_classes)
  if options.dataset == 'digits':
    data_dir = digits.ensure_digits()
  else:
    data_dir = options.data_dir
  train_files, eval_files = mnist_input.data_files(data_dir)
  skipping, skipped = _skipping(options)
  builder = functools.partial(
      mnist_input.mnist_input_fn_builder, image_size=options.image_size,
      num_classes=options.num_classes, **skipping)
  return Model(
      model_fn=_head(options, lambda params: network(config)),
      train_input_fn=builder(train_files, is_training=True,
                             seed=options.seed),
      eval_input_fn=builder(eval_files, is_training=False),
      serving_input_fn=image_serving_input_fn(options.image_size, 1),
      config=config, skipped=skipped)


def _resnet(options):
  config = resnet.ResNetConfig(depth=options.resnet_depth,
                               num_classes=options.num_classes,
                               image_size=options.image_size)
  if options.dataset == 'synthetic':
    train_fn = imagenet_input.synthetic_imagenet_input_fn_builder(
        image_size=options.image_size, num_classes=options.num_classes,
        seed=options.seed)
    eval_fn = imagenet_input.synthetic_imagenet_input_fn_builder(
        image_size=options.image_size, num_classes=options.num_classes,
        seed=options.seed + 1)
    skipped = None
  else:
    train_files, eval_files = data_files('imagenet', options.data_dir)
    skipping, skipped = _skipping(options)
    builder = functools.partial(
        imagenet_input.imagenet_input_fn_builder,
        image_size=options.image_size, num_classes=options.num_classes,
        **skipping)
    train_fn = builder(train_files, is_training=True)
    eval_fn = builder(eval_files, is_training=False)
  # Top-5 is the ImageNet habit; it says nothing with 5 classes or fewer.
  top_k = 5 if options.num_classes > 5 else None
  return Model(
      model_fn=_head(options, lambda params: resnet.resnet_v1(config),
                     top_k=top_k),
      train_input_fn=train_fn, eval_input_fn=eval_fn,
      serving_input_fn=image_serving_input_fn(options.image_size, 3),
      config=config, skipped=skipped)


def _bert(options):
  config = bert.BertConfig.preset(options.bert_preset,
                                  vocab_size=options.vocab_size)
  if options.dataset == 'synthetic':
    train_fn = bert_input.synthetic_bert_input_fn_builder(
        seq_length=options.seq_length, vocab_size=options.vocab_size,
        num_labels=options.num_classes, seed=options.seed)
    eval_fn = bert_input.synthetic_bert_input_fn_builder(
        seq_length=options.seq_length, vocab_size=options.vocab_size,
        num_labels=options.num_classes, seed=options.seed + 1)
    skipped = None
  else:
    train_files, eval_files = data_files('run_classifier', options.data_dir)
    skipping, skipped = _skipping(options)
    builder = functools.partial(
        bert_input.bert_input_fn_builder, seq_length=options.seq_length,
        num_labels=options.num_classes, **skipping)
    train_fn = builder(train_files, is_training=True)
    eval_fn = builder(eval_files, is_training=False)

  def network_fn_builder(params):
    # BERT asks for its variables in an explicit dtype, so it reads the
    # precision the wrapper put in params.
    dtype = eb.compute_dtype(params.get('precision', 'float32'))
    return bert.bert_classifier(config, options.num_classes, dtype)

  return Model(
      model_fn=_head(options, network_fn_builder, feature_key=None,
                     clip_norm=1.0, decay_steps=options.train_steps),
      train_input_fn=train_fn, eval_input_fn=eval_fn,
      serving_input_fn=ids_serving_input_fn(options.seq_length),
      config=config, skipped=skipped)


# Small enough that every family trains from a fresh clone on a laptop CPU;
# a real run overrides them with flags.
_MNIST_DEFAULTS = dict(
    optimizer='adam', learning_rate=1e-3, weight_decay=0.0, warmup_steps=0,
    train_steps=300, train_batch_size=64, eval_batch_size=120,
    image_size=28, num_classes=10)

# In --model's order of choices (the CLI lists them so).
FAMILIES = _by_name(
    # ResNet-18 on 32x32 synthetic images; ImageNet runs pass
    # --resnet_depth=50 --image_size=224 --num_classes=1000.
    Family('resnet', datasets=('synthetic', 'imagenet'), defaults=dict(
        optimizer='momentum', learning_rate=0.01, weight_decay=1e-4,
        warmup_steps=0, train_steps=20, train_batch_size=8,
        eval_batch_size=8, resnet_depth=18, image_size=32,
        num_classes=10), build=_resnet),
    Family('mnist_mlp', datasets=('digits', 'mnist'),
           defaults=_MNIST_DEFAULTS,
           build=functools.partial(_mnist, network=mnist.mnist_mlp)),
    Family('mnist_cnn', datasets=('digits', 'mnist'),
           defaults=_MNIST_DEFAULTS,
           build=functools.partial(_mnist, network=mnist.mnist_cnn)),
    # BERT-tiny on a synthetic pair task; AdamW with BERT's decay, linear
    # decay to 0 over train_steps and a 10% warm-up (`default_warmup_steps`).
    Family('bert', datasets=('synthetic', 'run_classifier'), defaults=dict(
        optimizer='adamw', learning_rate=1e-3, weight_decay=0.01,
        train_steps=60, train_batch_size=16, eval_batch_size=16,
        bert_preset='tiny', seq_length=64, num_classes=2,
        vocab_size=1000), build=_bert),
)

MODELS = tuple(FAMILIES)
# The first data set of each family is built in (no --data_dir needed).
DATASETS = {name: family.datasets for name, family in FAMILIES.items()}
DEFAULTS = {name: family.defaults for name, family in FAMILIES.items()}


def defaults(model, dataset):
  """Returns the values of unset options: the data set's over the family's.

  Args:
    model: a name in `MODELS`.
    dataset: a data set name; one outside `DATA` implies nothing.

  Returns:
    A new dict of option name to value.
  """
  values = dict(FAMILIES[model].defaults)
  if dataset in DATA:
    values.update(DATA[dataset].defaults)
  return values


def default_warmup_steps(model, train_steps):
  """Warm-up when --warmup_steps is unset: BERT's 10%, none elsewhere."""
  return FAMILIES[model].defaults.get('warmup_steps', train_steps // 10)


def build(options):
  """Returns the `Model` of a resolved, validated `TrainOptions`."""
  return FAMILIES[options.model].build(options)
