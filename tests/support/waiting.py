"""What tests wait for while a training subprocess runs."""

import glob
import os
import re


def checkpoint_at_or_after(model_dir, step):
  """True once model_dir holds a checkpoint of global step >= `step`.

  Any such checkpoint counts, not one named step: with
  `keep_checkpoint_max` a fast CPU can write and delete `model.ckpt-20`
  between two polls.
  """
  for index in glob.glob(os.path.join(model_dir, 'model.ckpt-*.index')):
    found = re.search(r'model\.ckpt-(\d+)\.index$', index)
    if found and int(found.group(1)) >= step:
      return True
  return False
