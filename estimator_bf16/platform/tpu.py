"""TPU hardware facts: cores per board, memory per core, the replica split.

The one home of what the package knows about TPU hardware: the training
loop, the submission program, the memory planner and the fit read it here.
"""

# Binary units of every byte figure the package prints or plans: their one
# home.
MiB = 2**20
GiB = 2**30

# Cores of one TPU v2-8 / v3-8 board: the shards a TPU job runs on unless
# told otherwise (a v2 -> v3 move keeps the count).
TPU_CORES_PER_BOARD = 8


def tpu_replicas(num_shards=None, num_cores_per_replica=None):
  """The model replicas a TPU job splits each global batch over.

  Args:
    num_shards: TPU cores; None for one board (`TPU_CORES_PER_BOARD`).
    num_cores_per_replica: cores per model replica; None for 1.

  Returns:
    int, the number of replicas.
  """
  return (num_shards or TPU_CORES_PER_BOARD) // (num_cores_per_replica or 1)


def tpu_batch_error(batch, num_shards=None, num_cores_per_replica=None):
  """Why a global `batch` cannot be split over the TPU replicas, or None.

  Each TPU core needs the same per-core batch, so the global batch must be
  a multiple of the replicas.

  Args:
    batch: int, the global batch (all cores together).
    num_shards: TPU cores; None for one board (`TPU_CORES_PER_BOARD`).
    num_cores_per_replica: cores per model replica; None for 1.

  Returns:
    None if `batch` divides evenly, else the reason as a sentence that
    follows the batch's name and value (e.g. 'train_batch_size=12 ' + it).
  """
  replicas = tpu_replicas(num_shards, num_cores_per_replica)
  if batch % replicas == 0:
    return None
  split = 'num_shards=%d' % (num_shards or TPU_CORES_PER_BOARD)
  if num_cores_per_replica:
    split += ' / num_cores_per_replica=%d' % num_cores_per_replica
  return ('is not divisible by the %d replicas (%s): each TPU core needs the '
          'same per-core batch.' % (replicas, split))


# High-bandwidth memory of one TPU core: 8 GiB on v2, 16 GiB on v3 (two
# cores a chip). A v2-8 or v3-8 board has 8 cores, so the global batch is
# 8 x the per-core batch. The memory planner plans for these two.
TPU_CORE_BYTES = (('v2', 8 * GiB), ('v3', 16 * GiB))

# XLA lays a tensor out in a TPU's memory in tiles of 8 x 128 elements over
# its two minor dimensions, padding each up to a whole number of tiles: the
# last dimension to a multiple of 128, the one before to a multiple of 8
# (Cloud TPU performance guide, "Tensor dimensions" / "Padding":
# cloud.google.com/tpu/docs/performance-guide). XLA may choose another
# layout for some tensors (convolutions); the planner pads the logical
# shape.
TPU_TILE = (8, 128)

# Memory of one core or chip of every TPU `--device` a fit plans for: the
# v2 and v3 cores above, and the v4 and v5p megacore chips and the v5e core
# (one core a chip), from Google Cloud's TPU version pages
# (cloud.google.com/tpu/docs/v2, /v3, /v4, /v5e, /v5p): v4 32 GiB, v5e
# 16 GiB, v5p 95 GiB a chip.
TPU_DEVICE_BYTES = dict(
    [('tpu-' + name, size) for name, size in TPU_CORE_BYTES] +
    [('tpu-v4', 32 * GiB), ('tpu-v5e', 16 * GiB), ('tpu-v5p', 95 * GiB)])
