"""Benchmarks of estimator_bf16: bfloat16 against float32, measured here.

One concern per module:

- `configs`: the models, sizes and run lengths of the quick and full modes.
- `graphs`: training-step graphs of the reference models, as users build
  them (unmodified model_fn, `eb.wrap_model_fn`, `eb.wrap_input_fn`).
- `kernels`: one matmul and one convolution, bfloat16 against float32.
- `step_memory`: measured step peaks and the largest batch within a budget.
- `levers`: the memory levers beyond bfloat16, measured side by side.
- `xla_levers`: the levers and the planner against XLA's own figures.
- `scaling`: two logical CPU devices against one.
- `throughput`: examples/sec in alternating windows.
- `overhead`: the wrapper against hand-written bfloat16 code.
- `keras_baseline`: the same MLP under Keras's `mixed_bfloat16` policy.
- `planning`: the memory planner on the benchmarked models.
- `convergence`: loss curves and eval metrics of both precisions.
- `check_time`: the wait of `check --xla --fit` on a ResNet at 224 px.
- `env`: CPU flags, versions and load of the machine.
- `report`: Markdown tables, targets and the loss-curve PNG.
- `runner`: runs them all in order; `scripts/benchmark.py` is the program.

Programs of their own (`python -m benchmarks.NAME`):

- `head_to_head`: ours against TensorFlow's oneDNN rewrite, in many windows.
- `profile`: where a training step's time goes, per kernel type.
- `kernel_table`: each op's kernel, bfloat16 against float32, on this CPU.
"""
