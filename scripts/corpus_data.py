"""The synthetic data of the corpus recipes, written in each program's format.

`write_data(kind, folder)` writes what a recipe's `data` names: a few
records or text files in the format the program reads (JPEG, MNIST or
COCO detection TFRecords, COCO's json, BERT-style vocabularies, configs,
classifier and pretraining files), small enough for a CPU run of seconds.
Everything is generated here from fixed seeds; nothing is downloaded.
"""

import json
import os

import numpy as np

# A tiny BERT-style vocabulary: the special tokens, then lowercase words.
_WORDS = ('the a of and to in is was it that he she they we you on for with '
          'as at by this from or but not are be have had his her their one '
          'all when there can an which were so if out up about into than '
          'them then some time only new over other after first two also '
          'good well very year day man world life hand part child eye '
          'house place week case point number group problem fact').split()
_VOCAB = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + _WORDS
VOCAB_SIZE = len(_VOCAB)
# Transformer sizes for a CPU run of seconds: BERT's config keys, plus
# the ALBERT ones (`embedding_size`, `ln_type`) its readers ignore.
_BERT_CONFIG = {
    'attention_probs_dropout_prob': 0.1, 'hidden_act': 'gelu',
    'hidden_dropout_prob': 0.1, 'hidden_size': 32, 'embedding_size': 16,
    'initializer_range': 0.02, 'intermediate_size': 64,
    'max_position_embeddings': 64, 'num_attention_heads': 2,
    'num_hidden_layers': 2, 'type_vocab_size': 2,
    'vocab_size': len(_VOCAB), 'ln_type': 'postln'}
# Sequence length and masked positions of the pretraining records.
SEQ_LENGTH = 32
MAX_PREDICTIONS = 5


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


def _sentence(rng, low=3, high=9):
  return ' '.join(rng.choice(_WORDS, size=rng.randint(low, high)))


def _write_lines(path, lines):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    f.write(''.join(line + '\n' for line in lines))


def _int_feature(values):
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  # pylint: enable=g-import-not-at-top
  return tf.train.Feature(int64_list=tf.train.Int64List(
      value=[int(v) for v in values]))


def _float_feature(values):
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  # pylint: enable=g-import-not-at-top
  return tf.train.Feature(float_list=tf.train.FloatList(
      value=[float(v) for v in values]))


def _write_examples(path, features):
  """`features`: dicts of name -> tf.train.Feature, one per record."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  # pylint: enable=g-import-not-at-top
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with tf.io.TFRecordWriter(path) as writer:
    for feature in features:
      writer.write(tf.train.Example(features=tf.train.Features(
          feature=feature)).SerializeToString())


def _token_ids(rng, length=SEQ_LENGTH):
  """input_ids / input_mask / segment_ids of a two-segment sequence."""
  used = rng.randint(length // 2, length + 1)
  ids = np.zeros(length, np.int64)
  ids[:used] = rng.randint(5, len(_VOCAB), size=used)
  ids[0], ids[used - 1] = 2, 3  # [CLS] ... [SEP]
  mask = (np.arange(length) < used).astype(np.int64)
  segments = ((np.arange(length) >= used // 2) & (mask > 0)).astype(np.int64)
  return ids, mask, segments


def _pretraining_records(path, count, seed):
  """BERT's masked-LM + next-sentence records (create_pretraining_data's
  features), `MAX_PREDICTIONS` masked positions each."""
  rng = np.random.RandomState(seed)
  records = []
  for _ in range(count):
    ids, mask, segments = _token_ids(rng)
    positions = np.sort(rng.choice(np.arange(1, int(mask.sum()) - 1),
                                   size=MAX_PREDICTIONS, replace=False))
    masked = ids[positions].copy()
    ids[positions] = 4  # [MASK]
    records.append({
        'input_ids': _int_feature(ids), 'input_mask': _int_feature(mask),
        'segment_ids': _int_feature(segments),
        'masked_lm_positions': _int_feature(positions),
        'masked_lm_ids': _int_feature(masked),
        'masked_lm_weights': _float_feature(np.ones(MAX_PREDICTIONS)),
        'next_sentence_labels': _int_feature([rng.randint(2)])})
  _write_examples(path, records)


def _squad(path, count, seed):
  """SQuAD 1.1 JSON: one paragraph per article, answers cut from it."""
  rng = np.random.RandomState(seed)
  articles = []
  for i in range(count):
    words = list(rng.choice(_WORDS, size=20))
    start = rng.randint(0, 17)
    answer = ' '.join(words[start:start + 2])
    context = ' '.join(words)
    offset = len(' '.join(words[:start])) + (1 if start else 0)
    articles.append({'title': 't%d' % i, 'paragraphs': [{
        'context': context, 'qas': [{
            'id': 'q%d' % i, 'question': _sentence(rng) + ' ?',
            'answers': [{'text': answer, 'answer_start': offset}]}]}]})
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    json.dump({'version': '1.1', 'data': articles}, f)


def _cola_rows(rng, split, count):
  """CoLA's TSV lines: train/dev without a header (source, label, its
  original label, sentence), test with one (index, sentence)."""
  if split == 'test':
    return ['index\tsentence'] + ['%d\t%s' % (i, _sentence(rng))
                                   for i in range(count)]
  return ['s%d\t%d\t\t%s' % (i, rng.randint(2), _sentence(rng))
          for i in range(count)]


def _bert_files(folder):
  """What BERT-style programs read, each in its own subfolder or file:
  `vocab.txt`, `bert_config.json`, `cola/` (CoLA: train/dev.tsv without
  a header, test.tsv with one), `lcqmc/` (train/dev/test.txt: a header,
  then text_a, text_b, label), `pretrain.tfrecord` (`SEQ_LENGTH`,
  `MAX_PREDICTIONS`) and `squad/` (train.json, dev.json)."""
  rng = np.random.RandomState(7)
  _write_lines(os.path.join(folder, 'vocab.txt'), _VOCAB)
  with open(os.path.join(folder, 'bert_config.json'), 'w') as f:
    json.dump(_BERT_CONFIG, f, indent=1)
  for name, count in (('train', 32), ('dev', 16), ('test', 8)):
    _write_lines(os.path.join(folder, 'cola', name + '.tsv'),
                 _cola_rows(rng, name, count))
    _write_lines(os.path.join(folder, 'lcqmc', name + '.txt'),
                 ['text_a\ttext_b\tlabel'] + [
                     '%s\t%s\t%d' % (_sentence(rng), _sentence(rng),
                                      rng.randint(2)) for _ in range(count)])
  _pretraining_records(os.path.join(folder, 'pretrain.tfrecord'), 64, seed=3)
  _squad(os.path.join(folder, 'squad', 'train.json'), 24, seed=4)
  _squad(os.path.join(folder, 'squad', 'dev.json'), 8, seed=5)


def _electra_files(folder):
  """ELECTRA's `--data-dir`: `vocab.txt`,
  `pretrain_tfrecords/pretrain_data.tfrecord` (input_ids, input_mask,
  segment_ids of `SEQ_LENGTH`) and `finetuning_data/cola/` (CoLA TSVs)."""
  rng = np.random.RandomState(8)
  _write_lines(os.path.join(folder, 'vocab.txt'), _VOCAB)
  for name, count in (('train', 32), ('dev', 16), ('test', 8)):
    _write_lines(os.path.join(folder, 'finetuning_data', 'cola',
                              name + '.tsv'), _cola_rows(rng, name, count))
  records = []
  for _ in range(64):
    ids, mask, segments = _token_ids(rng)
    records.append({'input_ids': _int_feature(ids),
                    'input_mask': _int_feature(mask),
                    'segment_ids': _int_feature(segments)})
  _write_examples(os.path.join(folder, 'pretrain_tfrecords',
                               'pretrain_data.tfrecord'), records)


def _uda_text_files(folder):
  """UDA's processed text (`text/utils/proc_data_utils.py`'s features):
  `vocab.txt`, `bert_config.json`, `sup/` and `dev/` (input_ids,
  input_mask, input_type_ids, label_ids in {0, 1}) and `unsup/bt-0.9/0/`
  (ori_* and aug_* of each), each `tf_examples.tfrecord`."""
  rng = np.random.RandomState(9)
  _write_lines(os.path.join(folder, 'vocab.txt'), _VOCAB)
  with open(os.path.join(folder, 'bert_config.json'), 'w') as f:
    json.dump(_BERT_CONFIG, f, indent=1)
  for name, count in (('sup', 32), ('dev', 16)):
    records = []
    for _ in range(count):
      ids, mask, segments = _token_ids(rng)
      records.append({'input_ids': _int_feature(ids),
                      'input_mask': _int_feature(mask),
                      'input_type_ids': _int_feature(segments),
                      'label_ids': _int_feature([rng.randint(2)])})
    _write_examples(os.path.join(folder, name, 'tf_examples.tfrecord'),
                    records)
  records = []
  for _ in range(64):
    record = {}
    for prefix in ('ori_', 'aug_'):
      ids, mask, segments = _token_ids(rng)
      record.update({prefix + 'input_ids': _int_feature(ids),
                     prefix + 'input_mask': _int_feature(mask),
                     prefix + 'input_type_ids': _int_feature(segments)})
    records.append(record)
  _write_examples(os.path.join(folder, 'unsup', 'bt-0.9', '0',
                               'tf_examples.tfrecord'), records)


def _uda_image_files(folder):
  """UDA's processed CIFAR-10 (`image/data.py`'s names and features):
  `train-size_32.tfrecord` and `test.tfrecord` (image: 32*32*3 floats,
  label) and `unsup-0.tfrecord` (ori_image, aug_image)."""
  rng = np.random.RandomState(10)

  def image():
    return _float_feature(rng.uniform(-1, 1, size=32 * 32 * 3))

  for name, count in (('train-size_32', 32), ('test', 16)):
    _write_examples(os.path.join(folder, name + '.tfrecord'), [
        {'image': image(), 'label': _int_feature([rng.randint(10)])}
        for _ in range(count)])
  _write_examples(os.path.join(folder, 'unsup-0.tfrecord'), [
      {'ori_image': image(), 'aug_image': image()} for _ in range(32)])


def _causal_lm_files(folder):
  """Grover / GPT-2 style language-model pretraining: `config.json` (the
  BERT sizes, which GroverConfig reads) and `lm.tfrecord` (input_ids of
  `SEQ_LENGTH` + 1, padded with 0, Grover's pad id)."""
  rng = np.random.RandomState(11)
  with open(os.path.join(folder, 'config.json'), 'w') as f:
    json.dump(_BERT_CONFIG, f, indent=1)
  records = []
  for _ in range(64):
    ids, _, _ = _token_ids(rng, SEQ_LENGTH + 1)
    records.append({'input_ids': _int_feature(ids)})
  _write_examples(os.path.join(folder, 'lm.tfrecord'), records)


def _encode_images(images, png=False):
  """JPEG (or PNG) bytes of uint8 [H, W, C] arrays.

  In a graph and session of their own, so that this works whether or not
  the caller runs eagerly.
  """
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  # pylint: enable=g-import-not-at-top
  with tf.Graph().as_default():
    placeholder = tf.compat.v1.placeholder(tf.uint8, [None, None, None])
    encode = (tf.io.encode_png(placeholder) if png else
              tf.io.encode_jpeg(placeholder, quality=95))
    with tf.compat.v1.Session() as session:
      return [session.run(encode, {placeholder: image}) for image in images]


def _bytes_feature(values):
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  # pylint: enable=g-import-not-at-top
  return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(values)))


# The COCO records' images: square, and as large as RetinaNet's smallest
# `image_size` (a multiple of 2**max_level, 128), so nothing is rescaled.
COCO_IMAGE_SIZE = 128
# Their classes: COCO's ids start at 1; 1..20 are also valid pixel classes
# of the segmentation variant (21 classes with background 0).
COCO_CLASSES = 20


def _coco_images(rng, count, first_id):
  """`count` random images with 1-3 boxes each, as COCO annotations.

  Args:
    rng: the np.random.RandomState that draws pixels and boxes.
    count: how many images.
    first_id: the first image's id (`image/source_id`); the others follow.

  Returns:
    (records, images, annotations): the tf.Example features of each image,
    and its COCO json entries (boxes in absolute [x, y, width, height]).
  """
  size = COCO_IMAGE_SIZE
  pixels = [rng.randint(0, 256, size=(size, size, 3)).astype(np.uint8)
            for _ in range(count)]
  masks, instances, records, images, annotations = [], [], [], [], []
  for index in range(count):
    image_id = first_id + index
    mask = np.zeros((size, size, 1), np.uint8)
    boxes = []
    for _ in range(rng.randint(1, 4)):
      # Whole pixels, 16 to 64 a side: about the size of RetinaNet's
      # smallest anchors (32 pixels at level 3); its matcher gives every
      # box at least one anchor, so each image has positives.
      width, height = rng.randint(16, 65, size=2)
      x0 = rng.randint(0, size - width + 1)
      y0 = rng.randint(0, size - height + 1)
      label = int(rng.randint(1, COCO_CLASSES + 1))
      boxes.append((x0, y0, int(width), int(height), label))
      mask[y0:y0 + height, x0:x0 + width] = label
      # Mask R-CNN's instance mask: 1 on the box's pixels, 0 elsewhere, as
      # create_coco_tf_record writes pycocotools' annToMask.
      instance = np.zeros((size, size, 1), np.uint8)
      instance[y0:y0 + height, x0:x0 + width] = 1
      instances.append(instance)
      # A box of the label's colour helps a few steps learn something.
      pixels[index][y0:y0 + height, x0:x0 + width] = (label * 12) % 256
    masks.append(mask)
    images.append({'id': image_id, 'file_name': '%012d.jpg' % image_id,
                   'height': size, 'width': size})
    for x0, y0, width, height, label in boxes:
      annotations.append({
          'id': len(annotations) + 1, 'image_id': image_id,
          'category_id': label, 'bbox': [x0, y0, width, height],
          # The same rectangle as a polygon, for the 'segm' evaluation.
          'segmentation': [[x0, y0, x0 + width, y0, x0 + width,
                            y0 + height, x0, y0 + height]],
          'area': float(width * height), 'iscrowd': 0})
    records.append({
        'image/source_id': _bytes_feature([str(image_id).encode()]),
        'image/filename': _bytes_feature([images[-1]['file_name'].encode()]),
        'image/format': _bytes_feature([b'jpeg']),
        'image/height': _int_feature([size]),
        'image/width': _int_feature([size]),
        'image/object/bbox/xmin': _float_feature(
            [b[0] / size for b in boxes]),
        'image/object/bbox/xmax': _float_feature(
            [(b[0] + b[2]) / size for b in boxes]),
        'image/object/bbox/ymin': _float_feature(
            [b[1] / size for b in boxes]),
        'image/object/bbox/ymax': _float_feature(
            [(b[1] + b[3]) / size for b in boxes]),
        'image/object/class/label': _int_feature([b[4] for b in boxes]),
        'image/object/class/text': _bytes_feature(
            [b'class%d' % b[4] for b in boxes]),
        'image/object/area': _float_feature([b[2] * b[3] for b in boxes]),
        'image/object/is_crowd': _int_feature([0] * len(boxes)),
        'image/segmentation/class/format': _bytes_feature([b'png'])})
  instance_pngs = iter(_encode_images(instances, png=True))
  for record, jpeg, png in zip(records, _encode_images(pixels),
                               _encode_images(masks, png=True)):
    record['image/encoded'] = _bytes_feature([jpeg])
    record['image/segmentation/class/encoded'] = _bytes_feature([png])
    count = len(record['image/object/class/label'].int64_list.value)
    record['image/object/mask'] = _bytes_feature(
        [next(instance_pngs) for _ in range(count)])
  return records, images, annotations


def _coco_files(folder):
  """Writes COCO detection records and their json into `folder`.

  The tf.Example format of tensorflow/tpu's object detection
  (`create_coco_tf_record.py`'s keys; boxes normalized to [0, 1]):
  `train.tfrecord` (16 images) and `val.tfrecord` (8), each image
  `COCO_IMAGE_SIZE` square with 1-3 boxes of classes 1..`COCO_CLASSES`,
  and `instances_val.json`, the validation images' annotations in COCO's
  json (ids = the records' `image/source_id`). The records also carry a
  PNG class map of the boxes (`image/segmentation/class/encoded`, 0 is
  background), which the segmentation variant reads, and Mask R-CNN's
  instance masks: one PNG per box (`image/object/mask`, 1 inside the box,
  0 outside), whose rectangles the json repeats as `segmentation` polygons.
  """
  rng = np.random.RandomState(12)
  train, _, _ = _coco_images(rng, 16, first_id=1)
  _write_examples(os.path.join(folder, 'train.tfrecord'), train)
  # Ids other than the training images', as in COCO's own splits.
  val, images, annotations = _coco_images(rng, 8, first_id=101)
  _write_examples(os.path.join(folder, 'val.tfrecord'), val)
  with open(os.path.join(folder, 'instances_val.json'), 'w') as f:
    # `info` and `licenses` as in COCO's own files: pycocotools' loadRes
    # copies `info` into the detections' dataset.
    json.dump({'info': {'description': 'corpus synthetic COCO',
                        'version': '1.0', 'year': 2018},
               'licenses': [], 'images': images, 'annotations': annotations,
               'categories': [{'id': i, 'name': 'class%d' % i,
                               'supercategory': 'none'}
                              for i in range(1, COCO_CLASSES + 1)]}, f)


_WRITERS = {'bert': _bert_files, 'electra': _electra_files,
            'causal_lm': _causal_lm_files, 'coco': _coco_files,
            'uda_text': _uda_text_files, 'uda_image': _uda_image_files}


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
  if kind in _WRITERS:
    _WRITERS[kind](folder)
    return
  raise ValueError('unknown data kind %r: %s' % (
      kind, ', '.join(['none', 'imagenet', 'mnist', 'cifar'] +
                      sorted(_WRITERS))))
