"""Autocast: unmodified model code computes in bfloat16 while it is built.

In graph mode every op that Python code creates goes through one TensorFlow
function, `op_def_library._apply_op_helper` (generated op wrappers call it
by module attribute, on TensorFlow 2.15 and 2.16+ alike), and every tensor
conversion through `tensor_conversion_registry.convert`. While a thread is
inside `autocast('bfloat16')`, the ops *that thread* creates are adjusted
just before they are created, by op type (`precision.op_lists`):

* matmul/conv ops run in bfloat16 when an input is bfloat16 or reads a
  trainable variable; `tf.matmul(bfloat16, float32)`, which TensorFlow would
  turn into a float32 `SparseMatMul`, becomes a bfloat16 `MatMul`
  (`weights`);
* the float32 list (softmax, cross-entropy, reductions, statistics,
  summaries) computes in float32 (`float32_list`), and so do uniform random
  draws and the comparisons that read them (`uniform_draws`), and
  TensorFlow's losses made of several ops (sigmoid and weighted
  cross-entropy, `reduce_logsumexp`), whole (`composites`);
* any other op whose float inputs mix float32 and bfloat16 computes in
  bfloat16 instead of failing with "Input 'y' of 'AddV2' Op has type float32
  that does not match type bfloat16" (an assignment keeps its variable's
  dtype), and a conversion of a float32 tensor to bfloat16 or back (as
  `tf.nn.bias_add` makes of its bias) is a cast (`casts`);
* `select(mask, x, 0)` on bfloat16 `x` is a multiply by the mask
  (`zero_select`);
* trainable variables requested in bfloat16 outside a variable scope (Keras
  layers without v2 dtype behaviour, `tf.Variable(..., dtype=bfloat16)`) are
  stored float32, under the same name (`master_weights`);
* the last multiply of a GELU (BERT's feed-forward activation, tanh or erf
  form) gets a gradient that reads only the GELU's input and its tanh/erf
  (`gelu_gradient`): the chain's other intermediates are freed in the
  forward pass instead of being kept for the backward one.

Casts are made once per tensor and reused; a float32 copy of a bfloat16
tensor is never cast back, the bfloat16 original is used. The gradients of
float32-list ops read bfloat16 tensors, not float32 copies (`gradients`).
Which bfloat16 tensor is the rounding of which float32 one is recorded in
`precision.rounding`.

A loss picked by a v2 `tf.cond` leaves its branch as the float32 value,
not its rounding (`branches`, which stands in for `cond_v2.cond_v2`).

Scope of the change: the three functions are replaced while any thread is
inside an autocast context (`contexts`) and put back when the last one
leaves, but the rules (`rules`) read thread-local state (`state`): a thread
that did not enter a context, e.g. one building its own graph at the same
time, gets TensorFlow's behaviour unchanged.
"""
