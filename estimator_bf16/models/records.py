"""TFRecord reading that names the file at fault and never ends short quietly.

`tf.data.TFRecordDataset` reports a corrupt record as "corrupted record at
114" without the file, and it reads a truncated file (a copy cut short) to
its last whole record without any error. `read_records` reads each file on
its own, counts the bytes it got and compares them with the file's size at
the end of the file, so both cases are caught and named:

  * by default, a clear error: "bad input: train-00007 is corrupt or
    truncated: read 1048576 of 2097152 bytes";
  * with `skip_corrupt=True` (the CLI's `--skip_corrupt_records`), the rest
    of that file is skipped with a warning on stderr, recorded in a
    `SkippedFiles` tally the caller can report, and training goes on.

Each record comes with its file and byte offset, so the parsers
(`check_records`) can name the record of a missing feature, a wrong image
size or a label out of range. Errors raised in the input pipeline carry the
prefix 'bad input:'; `translate_error` turns them into `InputError`.
"""

import re
import sys
import threading

import tensorflow as tf

MARKER = 'bad input:'
# Assertion messages list their data as "[a] [b] ...", then the op.
_MESSAGE_RE = re.compile(
    r'\[' + re.escape(MARKER) + r'(.*?)\]\s*(?:\n\t \[\[|$)', re.DOTALL)
# TFRecord framing around each record: length (8), its CRC (4), data CRC (4).
_FRAMING_BYTES = 16


class InputError(ValueError):
  """The training or eval data is unusable; the message names the file."""


class SkippedFiles(object):
  """The damaged files a `skip_corrupt` pipeline skipped, as it met them.

  Attributes:
    files: {path: (bytes read, file size, times skipped)}; a file read in
      every epoch is counted once per epoch in `times`.
  """

  def __init__(self):
    self._lock = threading.Lock()
    self.files = {}

  def add(self, path, read, size):
    """Records one skip (called from the input pipeline, on any thread)."""
    path = path.numpy().decode() if hasattr(path, 'numpy') else path
    with self._lock:
      times = self.files.get(path, (0, 0, 0))[2]
      self.files[path] = (int(read), int(size), times + 1)
    return 0

  @property
  def bytes_lost(self):
    with self._lock:
      return sum(size - read for read, size, _ in self.files.values())

  def summary(self):
    return '%d damaged file(s) skipped, %d bytes unread: %s' % (
        len(self.files), self.bytes_lost, ', '.join(sorted(self.files)))


def translate_error(error, context='', step=None):
  """Returns the `InputError` behind a TensorFlow error, or None.

  Args:
    error: an exception from `session.run` / `Estimator.train`.
    context: where the data was read, e.g. 'the training data'.
    step: the global step at the failure, if known.
  """
  text = getattr(error, 'message', None) or str(error)
  match = _MESSAGE_RE.search(text)
  if not match:
    return None
  where = ' in ' + context if context else ''
  if step is not None:
    where += ' at global step %d' % step
  what = match.group(1).replace('] [', ' ').strip()
  return InputError('Bad input%s: %s' % (where, what))


def list_files(file_pattern):
  """Returns (paths, sizes) of the files matching a glob, sorted by path.

  Raises:
    InputError: no file matches, or every match is empty.
  """
  paths = sorted(tf.io.gfile.glob(file_pattern))
  if not paths:
    raise InputError('No file matches %s.' % file_pattern)
  sizes = [tf.io.gfile.stat(path).length for path in paths]
  if not any(sizes):
    raise InputError('%s holds no records: %s empty.' % (
        file_pattern, 'the file is' if len(paths) == 1 else
        'all %d files are' % len(paths)))
  return paths, sizes


def _file_reader(skip_corrupt, skipped):
  """Returns `one_file(path, size)` -> Dataset of (record, path, offset).

  The reader stops at the first unreadable record; that error is dropped
  and judged at an end marker, where the byte count says whether the whole
  file was read. Everything here runs once per record, inside the parallel
  interleave, so it stays cheap: a plain assertion, and the conditional
  only in skip mode.
  """

  def report_skip(path, read, size):
    actions = [tf.print(
        'WARNING: --skip_corrupt_records: skipped the unreadable rest of',
        path, '(read', read, 'of', size, 'bytes)', output_stream=sys.stderr)]
    if skipped is not None:
      actions.append(tf.py_function(skipped.add, [path, read, size],
                                    Tout=tf.int64))
    with tf.control_dependencies(actions):
      return tf.constant(True)

  def one_file(path, size):
    marked = tf.data.TFRecordDataset(path).ignore_errors().map(
        lambda record: (record, False)).concatenate(
            tf.data.Dataset.from_tensors((tf.constant(''), True)))

    def account(offset, element):
      record, is_end = element
      length = tf.cast(tf.strings.length(record), tf.int64) + _FRAMING_BYTES
      short = tf.logical_and(is_end, offset < size)
      if skip_corrupt:
        check = tf.cond(short, lambda: report_skip(path, offset, size),
                        lambda: tf.constant(True))
      else:
        check = tf.raw_ops.Assert(
            condition=tf.logical_not(short), summarize=1, data=[
                tf.constant(MARKER), path,
                tf.constant('is corrupt or truncated: read'), offset,
                tf.constant('of'), size, tf.constant(
                    'bytes. Replace the file, or pass --skip_corrupt_records '
                    'to skip and count such damage.')])
      with tf.control_dependencies([check]):
        is_end = tf.identity(is_end)
      return offset + length, (record, path, offset, is_end)

    return marked.scan(tf.constant(0, tf.int64), account).filter(
        lambda record, path, offset, is_end: tf.logical_not(is_end)).map(
            lambda record, path, offset, is_end: (record, path, offset))

  return one_file


def read_records(file_pattern, *, skip_corrupt=False, skipped=None,
                 shuffle_files=False, cycle_length=1, seed=None):
  """Reads TFRecord files, checking that each one is read to its end.

  Args:
    file_pattern: glob of uncompressed TFRecord files.
    skip_corrupt: skip the unreadable rest of a damaged file (with a warning
      on stderr) instead of failing.
    skipped: a `SkippedFiles` that records each skip, or None.
    shuffle_files: visit the files in a random order (training).
    cycle_length: files read at once, interleaved record by record; 1 reads
      them one after another, in order.
    seed: file order seed when shuffling.

  Returns:
    A `tf.data.Dataset` of (record, path, offset): the serialized record,
    its file and its byte offset in that file.

  Raises:
    InputError: no file matches, or all are empty (at call time); at run
      time, a damaged file raises an `InvalidArgumentError` naming it, with
      the prefix 'bad input:' (see `translate_error`), unless
      `skip_corrupt`.
  """
  paths, sizes = list_files(file_pattern)
  files = tf.data.Dataset.from_tensor_slices(
      (tf.constant(paths), tf.constant(sizes, tf.int64)))
  if shuffle_files:
    files = files.shuffle(len(paths), seed=seed)
  one_file = _file_reader(skip_corrupt, skipped)
  if cycle_length > 1:
    return files.interleave(
        one_file, cycle_length=cycle_length,
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=not shuffle_files)
  return files.flat_map(one_file)


def check_records(bad, describe, paths=None, offsets=None):
  """Returns an op that fails, naming the first bad record of a batch.

  Args:
    bad: [B] bool, True for records with a problem.
    describe: `describe(i)` -> scalar string tensor saying what is wrong
      with record `i` (only built for the failure message).
    paths, offsets: [B] file paths and byte offsets of the records (from
      `read_records`), or None to name the record by its batch index.

  Returns:
    A bool tensor to use as a control dependency.
  """

  def fail():
    i = tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int32)
    if paths is not None:
      where = tf.strings.join([' (record at byte ', tf.strings.as_string(
          offsets[i]), ' of ', paths[i], ')'])
    else:
      where = tf.strings.join([' (record ', tf.strings.as_string(i),
                               ' of the batch)'])
    message = tf.strings.join([MARKER, ' ', describe(i), where])
    with tf.control_dependencies([tf.debugging.Assert(False, [message])]):
      return tf.constant(False)

  return tf.cond(tf.reduce_any(bad), fail, lambda: tf.constant(True))
