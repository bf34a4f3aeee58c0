"""How to run each public TPUEstimator program of the corpus small.

A recipe is the program's own flags for a CPU run of a few steps, tiny
batches and one evaluation, and the data it reads: its null input where it
has one ('none'), or a few records `scripts/corpus_data.py` writes in its
format.
Flags a commit's program does not define are dropped by the corpus runner
(`scripts/corpus_programs.py` reads the DEFINE_* calls of the program and the
modules it imports at that commit), so one recipe serves every commit where
the flag names agree; `{model_dir}` and `{data_dir}` are filled in per run.

A recipe with `skip` set is listed, not run: the reason says what the
program needs that a CPU run without network cannot give it.

tensorflow/tpu's recipes are keyed by the program's path; other
repositories' by 'OWNER/NAME:PATH', with `SOURCES` saying where each keeps
its programs.
"""

import dataclasses
import json
from typing import Optional, Tuple

from scripts.corpus_data import COCO_CLASSES
from scripts.corpus_data import COCO_IMAGE_SIZE
from scripts.corpus_data import MAX_PREDICTIONS
from scripts.corpus_data import SEQ_LENGTH
from scripts.corpus_data import VOCAB_SIZE

# Common to tensorflow/tpu's programs: the CPU, no TPU name, no exports.
_OFF_TPU = ('--use_tpu=false', '--tpu=', '--master=', '--num_cores=8')



@dataclasses.dataclass(frozen=True)
class Recipe:
  """Flags and data of one program.

  Attributes:
    flags: the program's flags, with `{model_dir}` / `{data_dir}`.
    data: 'none', 'imagenet' (JPEG TFRecords `train-*` / `validation-*`,
      labels 1..10 with ImageNet's 1-based convention), 'mnist'
      (`train.tfrecords` / `validation.tfrecords` / `test.tfrecords`),
      'cifar' (`train.tfrecords` of raw 32x32x3 images), 'coco' (detection
      records `train.tfrecord` / `val.tfrecord` and `instances_val.json`,
      for pycocotools: requirements-corpus.txt), or for the other
      repositories 'bert', 'electra', 'uda_text', 'uda_image' (what their
      writers below say).
    skip: if set, why the program is listed but not run.
    paths: folders under `models/` (another repository: under its first
      program folder) the program expects on its import path (besides
      that folder and its own).
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
_EXPORT = ('exports a trained checkpoint as a SavedModel: no training or '
           'evaluation to compare')
_TPU_ONLY = 'hard-codes use_tpu=True (TPU embedding / no use_tpu flag)'

# RetinaNet: ResNet-18, 128-pixel images (a multiple of 2**max_level),
# `--mode=train` up to max_steps = num_epochs x num_examples_per_epoch /
# train_batch_size = 4, then one `--eval_after_training` (so a rerun on
# the float32 checkpoint trains no step and evaluates those weights):
# `estimator.evaluate` with pycocotools on the json at 1fe0a9b8 (batch 1,
# `--eval_steps`), `predict` + pycocotools at the later commits
# (`--eval_samples`). No pretrained ResNet (`--resnet_checkpoint=` empty:
# no network). At 7dc921f8 and 862434aa the program itself fails on the
# CPU: its TPUEstimator model_fn reads params['auto_mixed_precision'],
# which main sets only for Estimator (KeyError building the train graph).
_RETINANET = _OFF_TPU + (
    '--model_dir={model_dir}', '--resnet_checkpoint=', '--mode=train',
    '--eval_after_training=true',
    '--training_file_pattern={data_dir}/train.tfrecord',
    '--validation_file_pattern={data_dir}/val.tfrecord',
    '--val_json_file={data_dir}/instances_val.json',
    '--hparams=image_size=%d,resnet_depth=18,use_bfloat16=false' %
    COCO_IMAGE_SIZE, '--train_batch_size=8', '--eval_batch_size=8',
    '--eval_samples=8', '--eval_steps=8', '--num_epochs=1',
    '--num_examples_per_epoch=32', '--iterations_per_loop=2',
    '--num_shards=8', '--add_warmup_requests=false')


def _json_flag(name, value):
  """`--name=JSON` with the braces a recipe's `str.format` keeps, and
  `{model_dir}` / `{data_dir}` still filled in."""
  text = json.dumps(value).replace('{', '{{').replace('}', '}}')
  for field in ('model_dir', 'data_dir'):
    text = text.replace('{{%s}}' % field, '{%s}' % field)
  return '--%s=%s' % (name, text)


# The detection framework (models/official/detection): its simplest model,
# `--model=retinanet`, configured by `--params_override` (JSON) over its
# defaults (640 pixels, ResNet-50, batch 64, 22500 steps). The same sizes as
# _RETINANET; `--mode=train` to total_steps, then `--eval_after_training`:
# `predict` on the 8 validation images scored by pycocotools on the json.
# With use_tpu=false main itself turns architecture.use_bfloat16 off, and
# its executor builds a plain Estimator (MirroredStrategy over the GPUs it
# finds: none), not a TPUEstimator.
_DETECTION_PARAMS = {
    'architecture': {'num_classes': COCO_CLASSES + 1},
    'resnet': {'resnet_depth': 18},
    'retinanet_parser': {'output_size': [COCO_IMAGE_SIZE, COCO_IMAGE_SIZE]},
    'train': {'train_batch_size': 8, 'total_steps': 4,
              'iterations_per_loop': 2, 'transpose_input': False,
              'train_file_pattern': '{data_dir}/train.tfrecord',
              'checkpoint': {'path': ''}},
    'eval': {'eval_batch_size': 8, 'eval_samples': 8,
             'num_steps_per_eval': 4,
             'eval_file_pattern': '{data_dir}/val.tfrecord',
             'val_json_file': '{data_dir}/instances_val.json'},
    'predict': {'predict_batch_size': 8},
}
_DETECTION = _OFF_TPU + (
    '--model=retinanet', '--model_dir={model_dir}', '--mode=train',
    '--eval_after_training=true',
    _json_flag('params_override', _DETECTION_PARAMS))

# Mask R-CNN (models/official/mask_rcnn): boxes and the instance masks of
# the 'coco' records, ResNet-18, 128 pixels (a multiple of 2**max_level,
# 64). `--mode=train_and_eval` with num_steps_per_eval above total_steps:
# no cycle, `train(max_steps=4)`, then one `predict` on the 8 validation
# images scored (boxes and masks) by pycocotools. `--mode=train` would
# train through `train_and_evaluate` when use_tpu is false (the executor's
# placeholder EvalSpec then fails in TPUEstimator). Fewer sampled
# RoIs and detections keep the mask head's CPU time small; the space-to-
# depth stem and the input transpose are TPU layouts. `precision=float32`
# turns its own bfloat16 off.
_MASK_RCNN_PARAMS = {
    'image_size': [COCO_IMAGE_SIZE, COCO_IMAGE_SIZE], 'backbone': 'resnet18',
    'num_classes': COCO_CLASSES + 1, 'precision': 'float32',
    'conv0_space_to_depth_block_size': 0, 'transpose_input': False,
    'train_batch_size': 8, 'eval_batch_size': 8, 'total_steps': 4,
    'iterations_per_loop': 2, 'num_steps_per_eval': 8, 'eval_samples': 8,
    'batch_size_per_im': 64, 'test_detections_per_image': 20,
    'training_file_pattern': '{data_dir}/train.tfrecord',
    'validation_file_pattern': '{data_dir}/val.tfrecord',
    'val_json_file': '{data_dir}/instances_val.json'}
_MNASNET_PATHS = ('official/mnasnet', 'official/efficientnet')
_MASK_RCNN = _OFF_TPU + (
    '--model_dir={model_dir}', '--mode=train_and_eval',
    '--precision=float32', '--transpose_input=false',
    '--iterations_per_loop=2',
    _json_flag('params_override', _MASK_RCNN_PARAMS))

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
    'models/official/retinanet/retinanet_main.py': Recipe(
        _RETINANET, 'coco'),
    # The 'coco' records carry its PNG class maps too, but its main builds
    # the RunConfig from a resolver it only sets with --use_tpu=true.
    'models/official/retinanet/retinanet_segmentation_main.py': Recipe(
        skip="with --use_tpu=false its main reads tpu_cluster_resolver, "
        'never set (UnboundLocalError before any Estimator): TPU only'),
    'models/official/mask_rcnn/mask_rcnn_main.py': {
        # Tried with the same settings as its HParams `--config` string:
        # `train_and_eval` trains, then fails in the evaluation's own code;
        # `train` with use_tpu=false trains through `train_and_evaluate`
        # with a placeholder EvalSpec that TPUEstimator refuses.
        '862434aa': Recipe(
            skip='Python 2 evaluation (coco_metric: range() of a float32 '
            'num_detections, TypeError); --mode=train with use_tpu=false '
            'ends in train_and_evaluate with an EvalSpec TPUEstimator '
            'refuses'),
        # mask_rcnn_model imports mnasnet_models (which imports
        # efficientnet's modules) from those folders.
        'default': Recipe(_MASK_RCNN, 'coco', paths=_MNASNET_PATHS)},
    'models/official/mask_rcnn/distributed_executer.py': Recipe(
        skip='a module with no main: mask_rcnn_main.py (its recipe) runs '
        'its TPUEstimator'),
    'models/official/detection/main.py': {
        # Its params_dict reads --params_override / --config_file with
        # yaml.load(text) and no Loader, which PyYAML 6 refuses; without
        # them the model is ResNet-50 at 640 pixels, batch 64.
        '862434aa': Recipe(
            skip='its params_dict calls yaml.load() without a Loader '
            '(TypeError under PyYAML 6) on --params_override, the only way '
            'to set the model small'),
        # efficientnet.py imports efficientnet_model from there.
        'default': Recipe(_DETECTION, 'coco',
                          paths=('official/efficientnet',))},
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


# Other repositories' programs: the BERT family (sentence-pair and
# single-sentence classification, masked-LM pretraining with next-sentence
# or sentence-order losses, SQuAD spans; AdamWeightDecay, LAMB, adapters
# that train a few variables), ELECTRA's generator/discriminator, UDA's
# consistency losses on text and images. Keys: 'OWNER/NAME:PATH'.
_BERT_COMMON = ('--use_tpu=false', '--vocab_file={data_dir}/vocab.txt',
                '--bert_config_file={data_dir}/bert_config.json',
                '--max_seq_length=%d' % SEQ_LENGTH, '--train_batch_size=8',
                '--eval_batch_size=8', '--predict_batch_size=8',
                '--iterations_per_loop=2', '--save_checkpoints_steps=100',
                '--output_dir={model_dir}')
_BERT_CLASSIFIER = _BERT_COMMON + ('--do_train=true', '--do_eval=true',
                                   '--num_train_epochs=1')
_PRETRAINING = ('--use_tpu=false', '--input_file={data_dir}/pretrain.tfrecord',
                '--do_train=true', '--do_eval=true',
                '--bert_config_file={data_dir}/bert_config.json',
                '--albert_config_file={data_dir}/bert_config.json',
                '--max_seq_length=%d' % SEQ_LENGTH,
                '--max_predictions_per_seq=%d' % MAX_PREDICTIONS,
                '--train_batch_size=8', '--eval_batch_size=8',
                '--num_train_steps=4', '--num_warmup_steps=1',
                '--max_eval_steps=2', '--iterations_per_loop=2',
                '--output_dir={model_dir}',
                '--export_dir={model_dir}/export')


# ELECTRA's argparse flags: --data-dir, --model-name, and --hparams (JSON)
# that overrides the config's fields; its model_dir is one of them.
_ELECTRA_SMALL = {
    'model_dir': '{model_dir}', 'model_size': 'small',
    'model_hparam_overrides': {'hidden_size': 32, 'num_hidden_layers': 2,
                               'num_attention_heads': 2,
                               'intermediate_size': 64},
    'embedding_size': 16, 'vocab_size': VOCAB_SIZE,
    'max_seq_length': SEQ_LENGTH, 'train_batch_size': 8,
    'eval_batch_size': 8, 'iterations_per_loop': 2}
_ELECTRA_PRETRAINING = dict(
    _ELECTRA_SMALL, do_train=True, do_eval=False, num_train_steps=4,
    num_warmup_steps=1, num_eval_steps=2, save_checkpoints_steps=4)
_ELECTRA_FINETUNING = dict(
    _ELECTRA_SMALL, task_names=['cola'], init_checkpoint=None,
    num_train_epochs=1.0, predict_batch_size=8, save_checkpoints_steps=100,
    write_test_outputs=False)
# Grover and its fork gpt2-ml: GPT-2 style causal LM, AdaFactor.
_CAUSAL_LM = ('--use_tpu=false', '--config_file={data_dir}/config.json',
              '--input_file={data_dir}/lm.tfrecord',
              '--output_dir={model_dir}', '--max_seq_length=%d' % SEQ_LENGTH,
              '--train_batch_size=8', '--num_train_steps=4',
              '--num_warmup_steps=1', '--iterations_per_loop=2',
              '--save_checkpoints_steps=4')
_SENTENCEPIECE = 'needs sentencepiece (not installed here) and its model file'

RECIPES.update({
    'google-research/bert:run_classifier.py': Recipe(
        _BERT_CLASSIFIER + ('--task_name=cola', '--data_dir={data_dir}/cola'),
        'bert'),
    'google-research/bert:run_pretraining.py': Recipe(_PRETRAINING, 'bert'),
    'google-research/bert:run_squad.py': Recipe(
        _BERT_COMMON + ('--do_train=true', '--do_predict=true',
                        '--train_file={data_dir}/squad/train.json',
                        '--predict_file={data_dir}/squad/dev.json',
                        '--num_train_epochs=1', '--max_seq_length=48',
                        '--doc_stride=16', '--max_query_length=12'), 'bert'),
    'google-research/bert:extract_features.py': Recipe(
        skip='predicts features from a trained checkpoint: no training or '
        'evaluation to compare'),
    'google-research/bert:run_classifier_with_tfhub.py': Recipe(
        skip='needs tensorflow_hub (not installed) and a BERT module from '
        'tfhub.dev (network)'),
    'google-research/adapter-bert:run_classifier.py': Recipe(
        _BERT_CLASSIFIER + ('--task_name=cola',
                            '--data_dir={data_dir}/cola'), 'bert'),
    'brightmart/albert_zh:run_classifier.py': Recipe(
        _BERT_CLASSIFIER + ('--task_name=lcqmc',
                            '--data_dir={data_dir}/lcqmc'), 'bert'),
    'brightmart/albert_zh:run_pretraining.py': Recipe(_PRETRAINING, 'bert'),
    'brightmart/albert_zh:run_pretraining_google.py': Recipe(
        _PRETRAINING + ('--optimizer=lamb',), 'bert'),
    'brightmart/albert_zh:run_pretraining_google_fast.py': Recipe(
        _PRETRAINING + ('--optimizer=lamb',), 'bert'),
    'brightmart/albert_zh:run_classifier_sp_google.py': Recipe(
        skip=_SENTENCEPIECE),
    'brightmart/albert_zh:run_classifier_clue.py': Recipe(
        skip='reads CLUE JSON tasks through classifier_utils; no recipe '
        'writes them yet (run_classifier.py covers its model)'),
    'google-research/electra:run_pretraining.py': Recipe(
        ('--data-dir={data_dir}', '--model-name=tiny',
         _json_flag('hparams', _ELECTRA_PRETRAINING)), 'electra'),
    'google-research/electra:run_finetuning.py': Recipe(
        ('--data-dir={data_dir}', '--model-name=tiny',
         _json_flag('hparams', _ELECTRA_FINETUNING)), 'electra'),
    'google-research/uda:text/main.py': Recipe(
        ('--use_tpu=false', '--do_train=true', '--do_eval=true',
         '--sup_train_data_dir={data_dir}/sup',
         '--unsup_data_dir={data_dir}/unsup',
         '--eval_data_dir={data_dir}/dev',
         '--bert_config_file={data_dir}/bert_config.json',
         '--vocab_file={data_dir}/vocab.txt', '--task_name=IMDB',
         '--model_dir={model_dir}', '--num_train_steps=4',
         '--num_warmup_steps=1', '--save_checkpoints_num=1',
         '--iterations_per_loop=2', '--unsup_ratio=1',
         '--tsa=linear_schedule', '--aug_ops=bt-0.9', '--aug_copy=1',
         '--uda_coeff=1', '--uda_softmax_temp=0.85',
         '--uda_confidence_thresh=0.45', '--max_seq_length=%d' % SEQ_LENGTH,
         '--train_batch_size=8', '--eval_batch_size=8'), 'uda_text',
        eval_flags=('--do_train=false',)),
    'google-research/uda:image/main.py': Recipe(
        ('--use_tpu=false', '--do_train=true', '--do_eval=true',
         '--task_name=cifar10', '--sup_size=32', '--aug_copy=1',
         '--unsup_ratio=1', '--tsa=linear_schedule',
         '--uda_softmax_temp=0.4', '--uda_confidence_thresh=0.8',
         '--data_dir={data_dir}', '--model_dir={model_dir}',
         '--train_batch_size=8', '--eval_batch_size=8', '--train_steps=4',
         '--iterations=2', '--save_steps=4', '--wrn_size=8'), 'uda_image'),
    'google-research/simclr:run.py': Recipe(
        skip='needs tensorflow_datasets and tensorflow_hub (not installed) '
        'and a TFDS dataset'),
    'rowanz/grover:lm/train.py': Recipe(_CAUSAL_LM, 'causal_lm'),
    'rowanz/grover:lm/validate.py': Recipe(
        skip='predicts only, and needs h5py and google-cloud-storage (not '
        'installed)'),
    'rowanz/grover:discrimination/run_discrimination.py': Recipe(
        skip="needs Grover's BPE encoder files and its JSONL news data; "
        'its evaluation is a predict'),
    'imcaspar/gpt2-ml:train/train_tpu.py': Recipe(_CAUSAL_LM, 'causal_lm'),
    'kimiyoung/transformer-xl:tf/train.py': Recipe(
        ('--use_tpu=false', '--model_dir={model_dir}',
         '--data_dir={data_dir}', '--record_info_dir={data_dir}',
         '--corpus_info_path={data_dir}/corpus-info.json',
         '--train_steps=4', '--iterations=2')),
})


@dataclasses.dataclass(frozen=True)
class Source:
  """Where a repository keeps its programs.

  Attributes:
    folders: folders searched for programs ('' is the whole tree); the
      first is on the import path with the recipes' `paths` under it.
    programs: programs found although they lack the marker (their
      TPUEstimator is built by a module they import).
  """
  folders: Tuple[str, ...] = ('',)
  programs: Tuple[str, ...] = ()


SOURCES = {
    # The detection framework's and Mask R-CNN's mains build their
    # (TPU)Estimator in an executor module they import.
    'tensorflow/tpu': Source(('models',), (
        'models/official/detection/main.py',
        'models/official/mask_rcnn/mask_rcnn_main.py')),
    'google-research/uda': Source(('',), ('image/main.py',)),
}


def source_for(name):
  """The `Source` of repository `name` (owner/name): the whole tree when
  the table has none."""
  return SOURCES.get(name, Source())


def recipe_for(program, commit, source='tensorflow/tpu'):
  """The recipe for `program` of `source` at `commit` (a full hash), or
  None. tensorflow/tpu's recipes are keyed by path, others' by
  'OWNER/NAME:PATH'."""
  found = RECIPES.get(program if source == 'tensorflow/tpu' else
                      '%s:%s' % (source, program))
  if isinstance(found, dict):
    for prefix, recipe in found.items():
      if prefix != 'default' and commit.startswith(prefix):
        return recipe
    return found['default']
  return found
