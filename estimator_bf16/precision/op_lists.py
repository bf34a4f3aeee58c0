"""Which op types compute in which dtype under autocast, by op type.

Like TensorFlow's grappler mixed-precision lists, the rules name op types
(what the graph holds), not Python functions, so they hold however the op
was reached: `tf.nn.softmax`, a closure, Keras, tf-slim or TensorFlow's own
internal callers all create the same `Softmax` op.

* `BFLOAT16_OPS`: the matrix units' ops. Under `'bfloat16'` they compute in
  bfloat16 when an input is bfloat16 or reads a trainable variable, so
  dtype-less `get_variable` weights (BERT's style) and Keras layers (which
  cast their inputs back to float32) still run in bfloat16.
* `FLOAT32_OPS`: numerically sensitive ops (losses, reductions, statistics,
  summaries). bfloat16 inputs are cast to float32 and the result is float32.
* `FLOAT32_KEEP_DTYPE_OPS`: softmax and log-softmax compute in float32 but
  hand back the input's dtype, so an attention block stays bfloat16 after its
  softmax; the float32 result is remembered, and the model_fn's outputs
  (predictions, export outputs) carry it, not its bfloat16 rounding.
* `FOLLOW_BFLOAT16_OPS`: batch norm reads its `x` in bfloat16 when that `x`
  is only a float32 copy of a bfloat16 tensor (what a Keras layer makes).
* `FLOAT32_RANDOM_OPS`: uniform random numbers asked for in bfloat16 are
  drawn in float32 and rounded. bfloat16 holds only 128 values in [0, 1),
  so `tf.nn.dropout` in bfloat16 keeps 0.8983 of its inputs at rate 0.1 and
  shrinks their mean by 0.34%; the float32 draw is also cheaper on CPUs.
* `COMPARISON_OPS`: a comparison that reads such a rounding (or any other
  that autocast remembers, e.g. softmax outputs) compares the float32
  original, so dropout's `uniform >= rate` keeps exactly 1 - rate. (Its
  scale 1 / (1 - rate) is still a bfloat16 constant, as the model asked:
  1.109375 for 1 / 0.9, a mean 0.16% low at rate 0.1, exact at 0.2 or 0.5.)

* `ZERO_SELECT_OPS`: `select(mask, x, 0)` on a bfloat16 `x` (dropout's
  last step, and its gradient) becomes `multiply_no_nan(x, cast(mask))`:
  bit for bit the same result (a dropped inf or NaN still gives +0), and on
  CPUs about 2.8x faster than TensorFlow's bfloat16 select kernel.

* `VARIABLE_OPS`: the ops that hold a variable; `VARIABLE_READ_OPS` the
  ops whose output is a snapshot of one (what recompute may recompute);
  `READ_THROUGH_OPS` the ops through which a tensor is still a read of the
  variable (what tells a matmul that reads weights).

* `BATCH_NORM_OPS`, `BATCH_NORM_GRAD_OPS`, `LOOP_OPS`, `CONTROL_FLOW_OPS`,
  `SOFTMAX_OP`: op families that several modules read (the audit's allowed
  mixes of dtypes, the memory planner's aliases, recompute's ops to keep,
  the activation statistics' watched ops), named here once.

* `FLOAT32_TWIN_OPS`: scalar arithmetic on losses (sums, scales,
  identities) that also gets a float32 twin when its bfloat16 inputs are
  roundings of float32 values, so a loss combined from TensorFlow's rounded
  losses is still the value computed in float32.

* `LOSS_TAIL_OPS`: besides rearrangements, the ops TensorFlow's loss code
  puts between a float32-list op and the cast that rounds its result (the
  final division of a mean); that cast is still a rounding of a float32
  loss.

* `MATMUL_OPS`, `CONV_OPS`, `DEPTHWISE_CONV_OPS`, `EINSUM_OPS` (together
  `MATMUL_CONV_OPS`): every op type, forward and gradient, grappler fusions
  included, that runs on the matrix units. The audit counts their FLOPs
  (the bfloat16 share), the memory planner and the activation statistics
  read the same sets: one list, so a new op type is counted everywhere.

Every other op follows its inputs: if float32 meets bfloat16, the op computes
in bfloat16 (a variable's dtype wins for assignments).

* The lists other modules classify ops by (the audit's allowed dtype mixes,
  the activation statistics' watched ops, recompute's fusions, the memory
  planner's aliases, forwarding and XLA fusions) and `OP`, the op types a
  module reads one at a time (`op.type == OP.Cast`): every op type the
  package names is spelled here, and `tests/test_structure.py` holds it so.
"""

import types

BFLOAT16_OPS = frozenset([
    'MatMul', 'SparseMatMul', 'BatchMatMul', 'BatchMatMulV2', 'Einsum',
    'Conv2D', 'Conv3D', 'DepthwiseConv2dNative', 'Conv2DBackpropInput',
    'Conv3DBackpropInputV2',
])

FLOAT32_OPS = frozenset([
    # Losses.
    'SoftmaxCrossEntropyWithLogits', 'SparseSoftmaxCrossEntropyWithLogits',
    'L2Loss', 'Log1p',
    # Reductions (loss and metric means, normalization statistics).
    'Sum', 'Mean', 'Prod', 'EuclideanNorm', 'SquaredDifference',
    # Summaries (v1 and v2), which must record what float32 would record.
    'ScalarSummary', 'HistogramSummary', 'WriteScalarSummary',
    'WriteHistogramSummary',
    # Those whose tensor has a dtype attribute: image summaries have no
    # bfloat16 kernel (tf.compat.v1.summary.image of a bfloat16 image fails
    # to build), and tensor summaries (tf.compat.v1.summary.tensor_summary,
    # TF2 tf.summary.write) would store a bfloat16 tensor where the float32
    # build stores a float32 one. Audio summaries take float32 only, which
    # the conversion rule already gives them.
    'ImageSummary', 'WriteImageSummary', 'TensorSummary', 'TensorSummaryV2',
    'WriteSummary',
])

# Softmax on its own: autocast rounds its gradient's reads (LogSoftmax's
# gradient needs no such rounding), and it is an activation worth watching.
SOFTMAX_OP = 'Softmax'
FLOAT32_KEEP_DTYPE_OPS = frozenset([SOFTMAX_OP, 'LogSoftmax'])

# Fused batch norm, forward; its gradients. Both take a 16-bit x (or
# gradient) beside float32 scale, offset and statistics by design.
BATCH_NORM_OPS = frozenset([
    'FusedBatchNorm', 'FusedBatchNormV2', 'FusedBatchNormV3',
])
BATCH_NORM_GRAD_OPS = frozenset([
    'FusedBatchNormGrad', 'FusedBatchNormGradV2', 'FusedBatchNormGradV3',
])
FOLLOW_BFLOAT16_OPS = BATCH_NORM_OPS

FLOAT32_RANDOM_OPS = frozenset([
    'RandomUniform', 'StatelessRandomUniform', 'StatelessRandomUniformV2',
])

COMPARISON_OPS = frozenset([
    'Greater', 'GreaterEqual', 'Less', 'LessEqual',
])

ZERO_SELECT_OPS = frozenset(['Select', 'SelectV2'])

# Matrix-unit op types, by how their FLOPs are counted (audit.py).
MATMUL_OPS = frozenset([
    'MatMul', '_FusedMatMul', 'SparseMatMul', 'BatchMatMul', 'BatchMatMulV2',
    'BatchMatMulV3', '_FusedBatchMatMulV2',
])
CONV_OPS = frozenset([
    'Conv2D', '_FusedConv2D', 'Conv2DBackpropInput', 'Conv2DBackpropFilter',
    'Conv3D', 'Conv3DBackpropInputV2', 'Conv3DBackpropFilterV2',
])
DEPTHWISE_CONV_OPS = frozenset([
    'DepthwiseConv2dNative', 'DepthwiseConv2dNativeBackpropInput',
    'DepthwiseConv2dNativeBackpropFilter',
])
EINSUM_OPS = frozenset(['Einsum'])
# What tf.matmul makes of mixed float32/bfloat16 inputs (SparseMatMul),
# autocast builds as the dense bfloat16 MatMul it equals.
SPARSE_MATMUL_OP = 'SparseMatMul'
MATMUL_OP = 'MatMul'
MATMUL_CONV_OPS = MATMUL_OPS | CONV_OPS | DEPTHWISE_CONV_OPS | EINSUM_OPS

# Ops that hold a variable (reference or resource), and ops that read one;
# READ_VARIABLE_OP alone reads the whole variable (same shape and dtype).
VARIABLE_OPS = frozenset(['VarHandleOp', 'VariableV2', 'Variable'])
READ_VARIABLE_OP = 'ReadVariableOp'
VARIABLE_READ_OPS = frozenset([READ_VARIABLE_OP, 'ResourceGather',
                               'ResourceGatherNd', 'VariableShape'])
# Ops that write a variable: assignments, and an optimizer's update, one
# fused kernel per optimizer whose type starts with the prefix.
VARIABLE_WRITE_OPS = frozenset(['AssignVariableOp', 'AssignAddVariableOp',
                                'AssignSubVariableOp'])
OPTIMIZER_UPDATE_PREFIX = 'ResourceApply'
# Ops through which a tensor is still "a read of this variable".
READ_THROUGH_OPS = frozenset([READ_VARIABLE_OP, 'Identity', 'Enter',
                              'TPUReplicatedInput'])

# TF 1.x control flow: tf.while_loop's ops hand a value on unchanged into a
# loop frame, out of it and to the next iteration; with tf.cond's Switch and
# Merge (which hand it down one branch and back) they make the rest, and
# reference-typed variables have a twin of each.
LOOP_OPS = frozenset(['Enter', 'Exit', 'NextIteration'])
CONTROL_FLOW_OPS = LOOP_OPS | frozenset(['Switch', 'Merge'])
REF_CONTROL_FLOW_OPS = frozenset('Ref' + op for op in CONTROL_FLOW_OPS)

# Ops between a float32-list op and the rounding cast in TensorFlow's own
# loss code, besides rearrangements (the final division of a mean).
LOSS_TAIL_OPS = frozenset(['DivNoNan', 'RealDiv', 'Neg', 'Mul'])

# Arithmetic that combines losses: scalar results of these ops, when their
# bfloat16 inputs are roundings of float32 values, also get a float32 twin
# computed from the float32 values (`autocast.float32_list.float32_twin`).
# `tf.identity(loss)`, `loss_a + loss_b`, `loss * 0.5` and
# `tf.compat.v1.losses.get_total_loss()` (an Identity or AddN) build them.
FLOAT32_TWIN_OPS = frozenset([
    'Identity', 'AddV2', 'Add', 'AddN', 'Sub', 'Mul', 'RealDiv', 'Div',
    'DivNoNan', 'Neg', 'Maximum', 'Minimum',
])

# bfloat16 kernels that are slower on a CPU than their float32 twin plus
# the two casts around it, by CPU kind (`cpu_kernels`): there autocast
# computes the op in float32 from bfloat16 inputs and rounds its result to
# bfloat16 (what a TPU's matrix unit and oneDNN's bfloat16 kernels do),
# unless the graph is built for a TPU or XLA. An op is listed when
# `benchmarks/kernel_table.py` timed its substituted form (bfloat16 in,
# float32 op, bfloat16 out) more than 1.15x faster than the bfloat16 op in
# each of two runs. Source runs: 2026-11-26, TensorFlow 2.15.1, a 2-core
# AMD EPYC with AVX512-BF16; 'native' with oneDNN on (its bfloat16
# kernels), 'emulated' with TF_ENABLE_ONEDNN_OPTS=0 (Eigen's kernels, which
# convert bfloat16 element by element: what an AVX2-only CPU runs). Ratios
# bfloat16 / substituted, emulated: Conv2DBackpropInput 11-15x,
# Conv2DBackpropFilter 7-10x, Einsum 25-26x, the depthwise conv and its
# gradients 2.5-3.4x, AvgPoolGrad 2.1-2.2x; native: Sigmoid 1.5-1.6x,
# TanhGrad 1.3x. Forward Conv2D and MatMul are as fast in bfloat16 on both
# kinds, and most elementwise ops lose their gain to the casts; ops slow in
# one run only (emulated Sigmoid, TanhGrad, AvgPool) are left out. Native
# BiasAddGrad (1.4-2.4x alone) is left out too: grappler fuses it with
# oneDNN's matmul gradient, and substituting it gained nothing on a whole
# program (tensorflow/tpu's mnist_tpu.py, 100 steps, three alternating
# runs: 14.9-15.6 s with it, 12.3-15.2 s without). Softmax, slow when
# emulated, is on the float32 list already. A later pair of runs on a
# 2-core AMD EPYC with AVX2 only (emulated by the CPU itself, TensorFlow
# 2.15.1, 2026-11-28) found two more emulated ops over the line in both:
# Sigmoid 1.33x / 1.33x and BiasAddGrad 1.34x / 1.30x; MaxPoolGrad and
# BatchMatMulV2 crossed it in one run only and are left out. The whole table:
# `python -m benchmarks.kernel_table`, or docs/cpu.md.
CPU_SLOW_BFLOAT16_OPS = {
    'emulated': frozenset([
        'Conv2DBackpropInput', 'Conv2DBackpropFilter', 'Einsum',
        'DepthwiseConv2dNative', 'DepthwiseConv2dNativeBackpropInput',
        'DepthwiseConv2dNativeBackpropFilter', 'AvgPoolGrad', 'Sigmoid',
        'BiasAddGrad',
    ]),
    'native': frozenset(['Sigmoid', 'TanhGrad']),
}


# Op types other modules read one at a time: `op.type == OP.Cast`. An
# attribute, not a string, so a misspelt name fails where it is read.
OP = types.SimpleNamespace(**{name: name for name in (
    'Add', 'AddV2', 'Cast', 'Const', 'Div', 'Erf', 'Erfc', 'ExpandDims',
    'Fill', 'Identity', 'Mul', 'MulNoNan', 'Neg', 'Placeholder',
    'PlaceholderV2', 'Pow', 'RealDiv', 'Reshape', 'ScalarSummary', 'Select',
    'Sqrt', 'Square', 'Squeeze', 'Sub', 'Tanh', 'Transpose', 'ZerosLike',
)})

# Ops whose inputs legitimately differ in float dtype (the audit's
# exceptions): casts, batch norm and control flow, bookkeeping that passes
# tensors of every dtype on (saves, prints, summaries, infeed/outfeed,
# function calls), and packing.
MIXED_DTYPE_OPS = (
    BATCH_NORM_OPS | BATCH_NORM_GRAD_OPS | CONTROL_FLOW_OPS | frozenset([
        'Cast', 'Bitcast', '_FusedBatchNormEx', 'NoOp', 'Identity',
        'IdentityN', 'Print', 'PrintV2', 'Assert', 'SaveV2', 'Save',
        'SaveSlices', 'MergeV2Checkpoints', 'TensorSummary',
        'TensorSummaryV2', 'If', 'StatelessIf', 'While', 'StatelessWhile',
        'PartitionedCall', 'StatefulPartitionedCall', 'IteratorGetNext',
        'OutfeedEnqueueTuple', 'InfeedEnqueueTuple', 'TPUReplicatedInput',
        'TPUReplicatedOutput', 'Pack', 'Unpack',
    ]))

# Producers of activations worth watching (the activation statistics);
# gradients and bookkeeping are not.
ACTIVATION_OPS = (
    MATMUL_CONV_OPS | BATCH_NORM_OPS | frozenset([
        SOFTMAX_OP, 'BiasAdd', 'Add', 'AddV2', 'Relu', 'Relu6', 'Elu', 'Selu',
        'Tanh', 'Sigmoid', 'MaxPool', 'AvgPool', 'Mean', 'Mul',
        'Square', 'Rsqrt', 'Erf']))

# Op pairs (producer -> consumer) that TensorFlow's CPU rewrites fuse, in
# the forward pass or in their gradients (recompute never cuts between).
CPU_FUSED_PRODUCER_OPS = (MATMUL_CONV_OPS | BATCH_NORM_OPS |
                          frozenset(['BiasAdd', 'BiasAddV1']))
CPU_FUSED_CONSUMER_OPS = BATCH_NORM_OPS | frozenset([
    'BiasAdd', 'BiasAddV1', 'Add', 'AddV2', 'Relu', 'Relu6', 'Elu',
    'LeakyRelu', 'Selu', 'Tanh', 'Sigmoid', 'Mul'])

# The memory planner's op kinds (memory/plan_simulate.py). Outputs that
# share the buffer of the input with the same index: no bytes of their
# own, but they keep that buffer alive (reads, reshapes, identities, loop
# hand-overs).
ALIAS_OPS = LOOP_OPS | frozenset([
    READ_VARIABLE_OP, 'Bitcast', 'Identity', 'IdentityN', 'Reshape',
    'Squeeze', 'ExpandDims', 'StopGradient', 'Snapshot', 'PreventGradient',
    'EnsureShape', 'CheckNumerics',
])
# Elementwise kernels that write into an input buffer of the output's size
# when this op is that buffer's last user (TensorFlow's
# `forward_input_or_allocate_output`).
FORWARDING_OPS = frozenset([
    'Abs', 'Add', 'AddN', 'AddV2', 'BiasAdd', 'ClipByValue', 'Div',
    'DivNoNan', 'Elu', 'EluGrad', 'Erf', 'Exp', 'Floor', 'LeakyRelu',
    'LeakyReluGrad', 'Log', 'Log1p', 'Maximum', 'Minimum',
    'Mul', 'MulNoNan', 'Neg', 'Pow', 'RealDiv', 'Reciprocal', 'Relu',
    'Relu6', 'Relu6Grad', 'ReluGrad', 'Rsqrt', 'RsqrtGrad', 'Select',
    'SelectV2', 'Selu', 'SeluGrad', 'Sigmoid', 'SigmoidGrad', 'Sign',
    'Softplus', 'SoftplusGrad', 'Sqrt', 'SqrtGrad', 'Square',
    'SquaredDifference', 'Sub', 'Tanh', 'TanhGrad',
])
# Outputs that exist before the step (or outside it) and are never freed.
PERSISTENT_OPS = frozenset(['Const', 'HostConst']) | VARIABLE_OPS
# Elementwise ops XLA fuses into their readers, and the readers it fuses
# them into: more elementwise ops, reductions and rearrangements (XLA's loop
# and input fusions).
XLA_FUSED_OPS = FORWARDING_OPS | COMPARISON_OPS | frozenset([
    'Cast', 'Equal', 'NotEqual', 'LogicalAnd', 'LogicalOr', 'LogicalNot',
    'OnesLike', 'ZerosLike', 'FloorDiv', 'FloorMod',
])
# Elementwise ops XLA does not compute again in a second reader (its
# instruction fusion's "expensive" ops: transcendental functions and
# division): with several readers their result gets a buffer.
XLA_EXPENSIVE_OPS = frozenset([
    'Div', 'DivNoNan', 'Elu', 'Erf', 'Exp', 'Log', 'Log1p', 'Pow',
    'RealDiv', 'Reciprocal', 'Rsqrt', 'Selu', 'Sigmoid', 'Softplus', 'Sqrt',
    'SqrtGrad', 'Tanh',
])
XLA_FUSING_OPS = XLA_FUSED_OPS | frozenset([
    'Sum', 'Mean', 'Max', 'Min', 'Prod', 'BiasAddGrad', 'Transpose',
    'Reshape', 'ExpandDims', 'Squeeze', 'Tile', 'BroadcastTo',
])
