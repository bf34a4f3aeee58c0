"""How to run each public TPUEstimator program of the corpus small.

A recipe is the program's own flags for a CPU run of a few steps, tiny
batches and one evaluation, and the data it reads: its null input where it
has one ('none'), or a few records `write_data` writes in its format.
Flags a commit's program does not define are dropped by `scripts/corpus.py`
(it reads the DEFINE_* calls of the program and the modules it imports at
that commit), so one recipe serves every commit where the flag names
agree; `{model_dir}` and `{data_dir}` are filled in per run.

A recipe with `skip` set is listed, not run: the reason says what the
program needs that a CPU run without network cannot give it.
"""

import dataclasses
import os
from typing import Optional, Tuple

import numpy as np

# Common to tensorflow/tpu's programs: the CPU, no TPU name, no exports.
_OFF_TPU = ('--use_tpu=false', '--tpu=', '--master=', '--num_cores=8')


@dataclasses.dataclass(frozen=True)
class Recipe:
  """Flags and data of one program.

  Attributes:
    flags: the program's flags, with `{model_dir}` / `{data_dir}`.
    data: 'none', 'imagenet' (JPEG TFRecords `train-*` / `validation-*`,
      labels 1..10 with ImageNet's 1-based convention), 'mnist'
      (`train.tfrecords` / `validation.tfrecords` / `test.tfrecords`) or
      'cifar' (`train.tfrecords` of raw 32x32x3 images).
    skip: if set, why the program is listed but not run.
    paths: folders under `models/` the program expects on its import path
      (besides `models/` and its own folder).
    eval_flags: flags added for the bfloat16 evaluation of the float32
      run's checkpoint, for programs that would otherwise train on from
      it (`train(steps=N)`): their evaluation-only mode.
  """
  flags: Tuple[str, ...] = ()
  data: str = 'none'
  skip: Optional[str] = None
  paths: Tuple[str, ...] = ()
  eval_flags: Tuple[str, ...] = ()


_SMALL_TRAIN = ('--model_dir={model_dir}', '--mode=train_and_eval',
                '--train_steps=4', '--steps_per_eval=4',
                '--train_batch_size=8', '--eval_batch_size=8',
                '--num_eval_images=8', '--iterations_per_loop=2',
                '--precision=float32', '--transpose_input=false',
                '--use_cache=false', '--num_parallel_calls=2')
_INCEPTION = ('--tpu=', '--use_tpu=false', '--model_dir={model_dir}',
              '--use_data=fake', '--mode=train_and_eval', '--train_steps=4',
              '--train_steps_per_eval=4', '--train_batch_size=8',
              '--eval_batch_size=8', '--eval_total_size=8', '--iterations=2',
              '--num_shards=8', '--width=128', '--height=128',
              '--precision=float32')
# The evaluation-only mode of the programs that have one: evaluate the
# newest checkpoint, then stop (mobilenet waits `eval_timeout` seconds for
# another, at least `min_eval_interval` after the last).
_EVAL_MODE = ('--mode=eval', '--eval_timeout=1', '--min_eval_interval=0')
_COCO = ('needs COCO-format TFRecords with box annotations, a COCO json and '
         'pycocotools; no recipe writes them yet')
_EXPORT = ('exports a trained checkpoint as a SavedModel: no training or '
           'evaluation to compare')
_TPU_ONLY = 'hard-codes use_tpu=True (TPU embedding / no use_tpu flag)'

# Program paths (under the repository root) -> a recipe, or {commit prefix:
# recipe} with a 'default' key when flags differ between commits. Sources:
# each program's flag definitions at the three commits the docs name.
# `--precision=float32` / `--use_bfloat16=false` switch off a program's own
# bfloat16 (so `run --precision` decides); `--tpu=` asks for no TPU.
RECIPES = {
    'models/official/resnet/resnet_main.py': Recipe(
        ('--tpu=', '--use_tpu=false', '--data_dir=null', '--resnet_depth=18',
         '--image_size=64') + _SMALL_TRAIN, eval_flags=_EVAL_MODE),
    'models/official/mnasnet/mnasnet_main.py': Recipe(
        ('--use_tpu=false', '--data_dir=null', '--model_name=mnasnet-small',
         '--input_image_size=64', '--use_bfloat16=false') + _SMALL_TRAIN,
        # mnas_utils appends 'tpu/models/official/efficientnet', relative
        # to the working folder of a checkout named tpu.
        paths=('official/efficientnet',), eval_flags=_EVAL_MODE),
    'models/official/efficientnet/main.py': Recipe(
        ('--use_tpu=false', '--data_dir=null', '--model_name=efficientnet-b0',
         '--input_image_size=64', '--use_bfloat16=false',
         '--archive_ckpt=false', '--num_label_classes=1000') + _SMALL_TRAIN,
        eval_flags=_EVAL_MODE),
    'models/official/squeezenet/squeezenet_main.py': {
        '1fe0a9b8': Recipe(skip='training length is a whole epoch of '
                           'ImageNet (no flag shortens it)'),
        'default': Recipe(
            ('--tpu=', '--use_tpu=false', '--data_dir={data_dir}',
             '--model_dir={model_dir}', '--batch_size=8',
             '--train_batch_size=8', '--eval_batch_size=8', '--num_epochs=1',
             '--num_examples_per_epoch=32', '--num_evals=1',
             '--num_eval_examples=8', '--iterations_per_loop=2',
             '--num_shards=8', '--num_cores_per_replica=1'), 'imagenet')},
    'models/official/mobilenet/mobilenet.py': {
        '1fe0a9b8': Recipe(
            ('--tpu=', '--use_tpu=false', '--model_dir={model_dir}',
             '--use_data=fake', '--mode=train_and_eval', '--train_steps=4',
             '--train_steps_per_eval=4', '--train_batch_size=8',
             '--eval_batch_size=8', '--eval_total_size=8', '--iterations=2',
             '--width=64', '--height=64', '--depth_multiplier=0.25',
             '--num_shards=8'), eval_flags=_EVAL_MODE),
        'default': Recipe(
            ('--tpu=', '--model_dir={model_dir}', '--mode=train_and_eval',
             '--data_source=fake', '--width=64', '--height=64',
             '--params_override=use_tpu=false,train_batch_size=8,'
             'eval_batch_size=8,train_steps=4,train_steps_per_eval=4,'
             'iterations_per_loop=2,eval_total_size=8,num_cores=8,'
             'depth_multiplier=0.25,moving_average=false'),
            eval_flags=_EVAL_MODE)},
    'models/official/amoeba_net/amoeba_net.py': Recipe(
        ('--use_tpu=false', '--data_dir={data_dir}', '--model_dir={model_dir}',
         '--mode=train_and_eval', '--train_batch_size=8',
         '--eval_batch_size=8', '--num_train_images=32',
         '--num_eval_images=8', '--num_epochs=1', '--num_epochs_per_eval=1',
         '--iterations_per_loop=2', '--image_size=96', '--num_cells=3',
         '--reduction_size=32', '--stem_reduction_size=16'), 'imagenet'),
    'models/experimental/amoeba_net/amoeba_net.py': Recipe(
        skip='training length is a whole epoch of ImageNet (no flag '
        'shortens it)'),
    'models/experimental/inception/inception_v2.py': Recipe(
        tuple(f for f in _INCEPTION if not f.startswith(
            ('--width', '--height', '--precision'))) +
        ('--width=64', '--height=64'), eval_flags=('--mode=eval',)),
    'models/experimental/inception/inception_v3.py': Recipe(
        _INCEPTION, eval_flags=('--mode=eval',)),
    'models/experimental/inception/inception_v4.py': Recipe(
        _INCEPTION, eval_flags=('--mode=eval',)),
    'models/experimental/inception/inception_v3_old.py': Recipe(
        ('--use_tpu=false', '--master=', '--model_dir={model_dir}',
         '--use_data=fake', '--batch_size=8', '--train_steps=4',
         '--iterations=2', '--num_shards=8', '--width=128', '--height=128',
         '--save_checkpoints_secs=3600')),
    'models/official/mnist/mnist_tpu.py': Recipe(
        ('--use_tpu=false', '--model_dir={model_dir}',
         '--data_dir={data_dir}', '--batch_size=8', '--train_steps=4',
         '--eval_steps=1', '--iterations=2', '--num_shards=8',
         '--enable_predict=false'), 'mnist'),
    'models/experimental/cifar_keras/cifar_keras.py': Recipe(
        ('--tpu=', '--use_tpu=false', '--model_dir={model_dir}',
         '--train_file={data_dir}/train.tfrecords', '--batch_size=8',
         '--train_steps=4', '--iterations_per_loop=2', '--num_shards=8'),
        'cifar'),
    'models/official/densenet/densenet_imagenet.py': Recipe(
        skip='hard-codes use_tpu=True (TPUEstimator without use_tpu, '
        'CrossShardOptimizer always)'),
    'models/experimental/resnet_bfloat16/resnet_main.py': Recipe(
        skip='hard-codes bfloat16 (no precision flag), train-only modes'),
    'models/official/resnet/benchmark/resnet_benchmark.py': Recipe(
        skip='broken at this commit (calls resnet_main with missing '
        'params or constants)'),
    'models/experimental/ncf/ncf_main.py': Recipe(skip=_TPU_ONLY),
    'models/experimental/embedding/model.py': Recipe(skip=_TPU_ONLY),
    'models/experimental/qanet/model.py': Recipe(
        skip='Python 2 only, needs tensor2tensor and SQuAD files'),
    'models/experimental/dcgan/dcgan_main.py': Recipe(
        skip='needs tensorflow_gan (2019 on) and writes PNGs with Pillow '
        'modes newer Pillow removed'),
    'models/experimental/show_and_tell/train.py': Recipe(
        skip='training only, 299-pixel captioned images, evaluation cannot '
        'be made small'),
    'models/experimental/deeplab/main.py': Recipe(
        skip='needs tensorflow/models research/deeplab and slim on the path '
        'and PASCAL-format segmentation records'),
    'models/official/retinanet/retinanet_main.py': Recipe(skip=_COCO),
    'models/official/retinanet/retinanet_segmentation_main.py': Recipe(
        skip=_COCO),
    'models/official/mask_rcnn/mask_rcnn_main.py': Recipe(skip=_COCO),
    'models/official/mask_rcnn/distributed_executer.py': Recipe(skip=_COCO),
    'models/official/detection/main.py': Recipe(skip=_COCO),
    # Export tools: they load a trained checkpoint and write a SavedModel;
    # nothing is trained or evaluated, so there is no float32 run to compare.
    'models/official/detection/export_saved_model.py': Recipe(skip=_EXPORT),
    'models/official/detection/projects/fashionpedia/export_saved_model.py':
        Recipe(skip=_EXPORT),
    'models/official/mask_rcnn/export_saved_model.py': Recipe(skip=_EXPORT),
    'models/official/unet3d/export_saved_model.py': Recipe(skip=_EXPORT),
    'models/experimental/resnet_bfloat16/resnet_benchmark.py': Recipe(
        skip='hard-codes bfloat16 (no precision flag), benchmark of '
        'resnet_main'),
    'models/samples/core/get_started/custom_tpuestimator.py': Recipe(
        skip='downloads the iris CSVs at run time (no network here) and '
        'reads them with pandas, not in the environment'),
}


def recipe_for(program, commit):
  """The recipe for `program` at `commit` (a full hash), or None."""
  found = RECIPES.get(program)
  if isinstance(found, dict):
    for prefix, recipe in found.items():
      if prefix != 'default' and commit.startswith(prefix):
        return recipe
    return found['default']
  return found


def _jpeg_records(path, count, seed, size=80):
  # pylint: disable=g-import-not-at-top
  from tests.support import record_writers
  # pylint: enable=g-import-not-at-top
  rng = np.random.RandomState(seed)
  images = [rng.randint(0, 256, size=(size, size, 3)).astype(np.uint8)
            for _ in range(count)]
  labels = [int(label) for label in rng.randint(1, 11, size=count)]
  record_writers.write_imagenet_tfrecord(path, images, labels)


def _mnist_records(path, count, seed):
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  # pylint: enable=g-import-not-at-top
  rng = np.random.RandomState(seed)
  with tf.io.TFRecordWriter(path) as writer:
    for _ in range(count):
      image = rng.randint(0, 256, size=784).astype(np.uint8)
      label = int(rng.randint(10))
      example = tf.train.Example(features=tf.train.Features(feature={
          'image_raw': tf.train.Feature(bytes_list=tf.train.BytesList(
              value=[image.tobytes()])),
          'label': tf.train.Feature(int64_list=tf.train.Int64List(
              value=[label])),
          'height': tf.train.Feature(int64_list=tf.train.Int64List(
              value=[28])),
          'width': tf.train.Feature(int64_list=tf.train.Int64List(
              value=[28])),
          'depth': tf.train.Feature(int64_list=tf.train.Int64List(
              value=[1])),
      }))
      writer.write(example.SerializeToString())


def _cifar_records(path, count, seed):
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  # pylint: enable=g-import-not-at-top
  rng = np.random.RandomState(seed)
  with tf.io.TFRecordWriter(path) as writer:
    for _ in range(count):
      # CIFAR's binary order: the red plane, then green, then blue.
      image = rng.randint(0, 256, size=3 * 32 * 32).astype(np.uint8)
      example = tf.train.Example(features=tf.train.Features(feature={
          'image': tf.train.Feature(bytes_list=tf.train.BytesList(
              value=[image.tobytes()])),
          'label': tf.train.Feature(int64_list=tf.train.Int64List(
              value=[int(rng.randint(10))])),
      }))
      writer.write(example.SerializeToString())


def write_data(kind, folder):
  """Writes the records a recipe's `data` names into `folder`."""
  os.makedirs(folder, exist_ok=True)
  if kind == 'none':
    return
  if kind == 'imagenet':
    _jpeg_records(os.path.join(folder, 'train-00000-of-00001'), 64, seed=1)
    _jpeg_records(os.path.join(folder, 'validation-00000-of-00001'), 64,
                  seed=2)
    return
  if kind == 'cifar':
    _cifar_records(os.path.join(folder, 'train.tfrecords'), 64, seed=1)
    return
  if kind == 'mnist':
    for name, seed in (('train', 1), ('validation', 2), ('test', 3)):
      _mnist_records(os.path.join(folder, name + '.tfrecords'), 64, seed)
    return
  raise ValueError('unknown data kind %r: none, imagenet, mnist, cifar' %
                   (kind,))
