"""Writing the SavedModel of a compat Estimator export.

The serving graph (serving_input_receiver_fn, then model_fn in PREDICT mode)
is built by the Estimator; this module turns it into a SavedModel with the
v1 builder, as tf.estimator did: tag 'serve', the receiver's signatures, the
variables restored from a checkpoint, written to `<base>/<timestamp>.tmp`
and renamed to `<base>/<timestamp>` once complete.
"""

import os
import time

from absl import logging
import tensorflow as tf

from estimator_bf16.compat import export as export_lib


def timestamped_dir(base):
  """base/<seconds since epoch>, one second later if that one exists."""
  tf.io.gfile.makedirs(base)
  stamp = int(time.time())
  while (tf.io.gfile.exists(os.path.join(base, str(stamp))) or
         tf.io.gfile.exists(os.path.join(base, str(stamp) + '.tmp'))):
    stamp += 1
  return os.path.join(base, str(stamp))


def write_saved_model(spec, receiver, checkpoint_path, export_dir_base,
                      assets_extra, as_text, session_config):
  """Writes the serving graph and a checkpoint's variables as a SavedModel.

  Called with the serving graph as the default graph.

  Args:
    spec: the PREDICT-mode `EstimatorSpec` model_fn returned for `receiver`.
    receiver: the `ServingInputReceiver` (or `TensorServingInputReceiver`).
    checkpoint_path: the checkpoint whose variables are exported.
    export_dir_base: parent directory (str or path) of the export.
    assets_extra: None, or {path inside assets.extra: source file}.
    as_text: write saved_model.pbtxt instead of saved_model.pb.
    session_config: a `tf.compat.v1.ConfigProto`.

  Returns:
    str, the export directory.

  Raises:
    ValueError: no signature could be built.
  """
  outputs = export_lib.export_outputs_for(spec.export_outputs,
                                          spec.predictions)
  signatures = export_lib.signature_defs(receiver, outputs)
  scaffold = spec.scaffold or tf.compat.v1.train.Scaffold()
  saver = scaffold.saver or tf.compat.v1.train.Saver(sharded=True)
  local_init = scaffold.local_init_op or tf.group(
      tf.compat.v1.local_variables_initializer(),
      tf.compat.v1.tables_initializer())
  export_dir = timestamped_dir(os.fspath(export_dir_base))
  # Written under a temporary name, so a reader watching export_dir_base
  # never sees a half-written export.
  temp_dir = export_dir + '.tmp'
  with tf.compat.v1.Session(config=session_config) as session:
    saver.restore(session, checkpoint_path)
    builder = tf.compat.v1.saved_model.Builder(temp_dir)
    builder.add_meta_graph_and_variables(
        session, [tf.compat.v1.saved_model.tag_constants.SERVING],
        signature_def_map=signatures,
        assets_collection=tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.ASSET_FILEPATHS),
        main_op=local_init, strip_default_attrs=True, saver=saver)
    builder.save(as_text)
  for target, source in (assets_extra or {}).items():
    destination = os.path.join(temp_dir, 'assets.extra', target)
    tf.io.gfile.makedirs(os.path.dirname(destination))
    tf.io.gfile.copy(source, destination, overwrite=True)
  tf.io.gfile.rename(temp_dir, export_dir)
  logging.info('SavedModel written to %s', export_dir)
  return export_dir
