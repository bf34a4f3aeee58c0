#!/usr/bin/env bash
# Runs the test suite under both TensorFlow backends:
#   tf215      .venv            requirements.txt             the real TPUEstimator
#   tf-latest  .venv-tf-latest  requirements-tf-latest.txt   estimator_bf16.compat
# Each virtualenv is created (pinned, then the package in editable mode) on
# first use, and again when its requirements file or setup.py changes.
# Both venvs are created before any test runs, because the cross-version
# test in tests/compat/test_compat_backend.py drives the other one in a
# subprocess.
#
# Usage: scripts/test_matrix.sh [all|tf215|tf-latest] [extra pytest args]
#   PYTHON=python3.11 picks the interpreter for new venvs (scripts/make_venv.sh).
#   TF_LATEST_TESTS="tests/a.py tests/b.py" replaces the tf-latest subset
#   (TF_LATEST_TESTS=tests runs the whole suite there).
#   COVERAGE=1 measures line coverage of estimator_bf16/ across both runs
#   (subprocesses included) and prints the total at the end.
# Exits non-zero if either run fails; both runs always happen. The last line
# gives the wall time of the whole run and of each stage.
set -uo pipefail
cd "$(dirname "$0")/.."
WHICH="${1:-all}"
shift || true

# Both cores (pytest-xdist, one worker per core; tests are independent and
# each writes to its own temporary folders). A class's tests (a module's,
# for test functions) go to one worker (`--dist loadscope`), so what a
# class builds once for all its tests (setUpClass, module fixtures) is
# built once, not once per worker. Tests that measure a step's memory peak
# run beside the others: the traced step runs one op at a time
# (estimator_bf16/memory/peak.py, traced_run_options), so the other
# worker's load does not move its order. The 15 slowest tests are printed
# at the end. PYTEST_WORKERS=0 runs everything in one process.
# More workers than cores did not help: on a 2-core machine three workers
# took 656 s for the whole run where two took 680 s, a smaller gap than
# between two runs of the same code with two (726 and 787 s): the tests
# are CPU-bound, not waiting. Nor did one TensorFlow thread per worker
# (TF_NUM_INTRAOP_THREADS=1): 3% less CPU on tests/levers, tests/models
# and tests/autocast, within the same noise.
WORKERS="${PYTEST_WORKERS:-2}"

# Seconds of each stage, in order, for the closing line.
STAGES=()
# timed NAME COMMAND...: runs COMMAND and records its wall time as NAME.
timed() {
  local name="$1"; shift
  local began=$SECONDS code
  "$@"
  code=$?
  STAGES+=("$name $((SECONDS - began)) s")
  return $code
}

COVERAGE_ARGS=()
if [[ "${COVERAGE:-0}" == 1 ]]; then
  # One data file for both virtualenvs (the same editable source tree), so
  # the total is the suite's, not one TensorFlow's.
  COVERAGE_ARGS=(--cov=estimator_bf16 --cov-append --cov-report=)
  rm -f .coverage .coverage.*
fi

# run_pytest LABEL PYTHON [args]: one stage, timed as LABEL; exit 5 (no
# test selected: -k may select none) is no failure.
run_pytest() {
  local label="$1" python="$2" code
  shift 2
  local parallel=(-n "$WORKERS" --dist loadscope)
  [[ "$WORKERS" == 0 ]] && parallel=()
  timed "$label" "$python" -m pytest -q --durations=15 "${parallel[@]}" \
    "${COVERAGE_ARGS[@]}" "$@"
  code=$?
  [[ $code == 0 || $code == 5 ]]
}

run_tf215() {
  echo "test_matrix: TensorFlow 2.15 (.venv), full suite" >&2
  run_pytest "TF 2.15" .venv/bin/python tests "$@"
}

# The newest-TensorFlow run: the tests whose code path differs on the
# compat backend or with TensorFlow's version. The precision core (the ops
# a TensorFlow version builds differ), the estimator API (test_estimator
# runs unmodified through the compat backend), the compat backend itself,
# the reference models trained through make_tpu_estimator, the runner and
# the levers (they patch and wrap whichever Estimator is there), XLA.
# Left to the TensorFlow 2.15 run: what is the same code on both, i.e. the
# launcher driving plain Python children, the stderr filter of a child
# process, the corpus script's bookkeeping (test_runner and test_tf1 run
# programs through the runner here), the measured `run --fit` (what it
# runs is here in parts: `run --fit` choosing and training a plan in
# test_fit, the levers it applies through the compat backend in
# test_accumulation, `run --memory`'s measured peak in test_fit and
# test_runner), and the cross-version test, which checks
# both directions in one run (each TensorFlow continues and serves the
# other's checkpoints and SavedModels).
TF_LATEST_DEFAULT=(
  tests/precision/test_casting.py tests/precision/test_scope_and_float32_list.py
  tests/safety/test_audit.py tests/estimator/test_wrappers.py
  tests/optimizers/test_adafactor.py tests/estimator/test_estimator.py
  tests/estimator/test_tf_check.py tests/compat/test_compat_backend.py
  tests/models/test_resnet.py tests/models/test_bert.py
  tests/apps/test_train_cli.py tests/runner/test_runner.py
  tests/autocast/test_autocast.py tests/models/test_styles.py
  tests/platform/test_cpu.py tests/distribute/test_distribute.py
  tests/distribute/test_multi_worker.py tests/autocast/test_gelu_gradient.py
  tests/compat/test_step_deadline.py tests/runner/test_tf1.py
  tests/platform/test_quiet.py tests/apps/test_progress.py
  tests/levers/test_accumulation.py tests/levers/test_recompute.py
  tests/memory/test_fit.py tests/autocast/test_cpu_kernels.py
  tests/memory/test_xla_step.py tests/compat/test_keras_to_estimator.py
  tests/autocast/test_loss_table.py tests/compat/test_log_lines.py
  tests/estimator/test_callable_forms.py tests/runner/test_refusals.py
  tests/autocast/test_metric_table.py tests/autocast/test_summary_table.py
)
TF_LATEST_DESELECT=(
  tests/distribute/test_multi_worker.py::LaunchTest
  # A killed worker is the launcher's to notice and a resume is the compat
  # training loop's restore: the same code here. The hung worker, whose
  # collective timeout and the error it raises are this TensorFlow's, runs
  # here; test_distribute moves strategy checkpoints.
  tests/distribute/test_multi_worker.py::KilledWorkerTest
  tests/distribute/test_multi_worker.py::ResumeTest
  tests/platform/test_quiet.py::DescriptorFilterTest
  tests/memory/test_fit.py::RunFitCommandTest
  tests/compat/test_compat_backend.py::CrossVersionTest
  # The families differ in their model code, which test_resnet and
  # test_bert run here; the command's path (training, summaries, export
  # through the compat backend) is every family's, and the MNIST MLP case
  # runs it here.
  tests/apps/test_train_cli.py::FamilyTrainingTest::test_{export_serves_float32,trains_evaluates_and_writes_summaries}_{resnet,bert}_{float32,bfloat16}
  tests/apps/test_train_cli.py::FamilyTrainingTest::test_bfloat16_eval_loss_close_to_float32_{resnet,bert}
  # The CNN's path through the command is the MLP's; the command line's
  # parsing and exit codes are the same code on both.
  tests/apps/test_train_cli.py::FamilyTrainingTest::test_{export_serves_float32,trains_evaluates_and_writes_summaries}_mnist_cnn_{float32,bfloat16}
  tests/apps/test_train_cli.py::FamilyTrainingTest::test_bfloat16_eval_loss_close_to_float32_mnist_cnn
  tests/apps/test_train_cli.py::CommandLineTest
  # Each style's graph (its ops' dtypes, its variables, one step updating
  # every variable) is built here by StyleGraphTest; what training through
  # the compat Estimator adds is the same loop for every style, so it runs
  # for the Keras style only (tf-keras's layers are the style whose code
  # differs most between the two TensorFlows).
  tests/models/test_styles.py::StyleTrainingTest::test_{bfloat16_trains_like_float32,checkpoint_round_trip_float32_bfloat16_float32}{0,2,3}
  # Parameter counts are the model's code, not TensorFlow's.
  tests/models/test_resnet.py::ResNetTest::test_parameter_counts_match_published_networks
  # The launcher forwards the signal with the same code on both; a chief
  # that saves on SIGTERM through the compat loop is test_runner's
  # LegacyProgramTest here, and a two-process compat job HungWorkerTest.
  tests/distribute/test_multi_worker.py::LauncherSigtermTest
  # What --fit decides from a plan (nothing fits, model-parallel advice, a
  # TPU core's budget, no static batch) is the same code on every
  # TensorFlow; here a plan of this TensorFlow's graph is chosen from
  # (test_the_choice_and_its_json_agree), trained with
  # (RunFitChoiceCommandTest's float32 case) and refused by `run`.
  tests/memory/test_fit.py::CheckFitCommandTest::test_an_impossible_budget_exits_1_with_model_parallel_advice
  tests/memory/test_fit.py::CheckFitCommandTest::test_a_plan_that_cannot_be_made_fails_the_fit0
  tests/memory/test_fit.py::CheckFitOnTpuCommandTest
  tests/memory/test_fit.py::RunFitChoiceCommandTest::test_nothing_fits_trains_nothing
  # The device loop in TF 1.x control flow (v1) is what TensorFlow 2.15's
  # TPUEstimator builds for a TPU; the compat backend has no TPU, and here
  # XLA compiles the same loops in their v2 form (TF2's default).
  tests/memory/test_xla_step.py::DeviceAccumulationTest::test_k_micro_batches_in_the_loop_equal_the_big_batch_{adafactor,adam,adamw,bert_style,cross_shard_adam}_v1
  tests/memory/test_xla_step.py::DeviceAccumulationTest::test_with_recompute_v1
  tests/memory/test_xla_step.py::DeviceAccumulationBytesTest::test_the_loop_waits_for_micro_batch_0_v1
  tests/memory/test_xla_step.py::RecomputeOnXlaTest::test_fewer_bytes_and_the_same_variables_v1
  tests/memory/test_xla_step.py::AutocastInLoopTest::test_raw_variables_are_read_in_bfloat16_in_the_loop_v1
)

run_tf_latest() {
  # The session-wide compat.install() is the opt-in legacy users make, and
  # TF_USE_LEGACY_KERAS=1 routes tf.keras to tf-keras as TensorFlow
  # recommends for tf.keras 2 code. Tests that need TensorFlow 2.15 itself
  # skip themselves.
  local tests deselect=() node
  if [[ -n "${TF_LATEST_TESTS:-}" ]]; then
    read -r -a tests <<< "$TF_LATEST_TESTS"
  else
    tests=("${TF_LATEST_DEFAULT[@]}")
  fi
  for node in "${TF_LATEST_DESELECT[@]}"; do
    deselect+=(--deselect "$node")
  done
  echo "test_matrix: newest TensorFlow (.venv-tf-latest): ${tests[*]}" >&2
  TF_USE_LEGACY_KERAS=1 run_pytest "TF latest" \
    .venv-tf-latest/bin/python \
    "${tests[@]}" -p tests.support.compat_install_plugin "${deselect[@]}" "$@"
}

case "$WHICH" in
  all|tf215|tf-latest) ;;
  *) echo "usage: $0 [all|tf215|tf-latest] [pytest args]" >&2; exit 2 ;;
esac

# Both at once: each is mostly waiting for downloads and disk.
make_venvs() {
  local first second status=0
  scripts/make_venv.sh .venv requirements.txt &
  first=$!
  scripts/make_venv.sh .venv-tf-latest requirements-tf-latest.txt &
  second=$!
  wait "$first" || status=1
  wait "$second" || status=1
  return "$status"
}
timed virtualenvs make_venvs || exit 1

status=0
if [[ "$WHICH" == all || "$WHICH" == tf215 ]]; then
  run_tf215 "$@" || status=1
fi
if [[ "$WHICH" == all || "$WHICH" == tf-latest ]]; then
  run_tf_latest "$@" || status=1
fi
if [[ "${COVERAGE:-0}" == 1 ]]; then
  echo "test_matrix: line coverage of estimator_bf16/, both runs:" >&2
  .venv/bin/python -m coverage report --format=total 2>/dev/null |
    sed 's/^/test_matrix: coverage /; s/$/%/' >&2
fi
summary=$(IFS=';'; echo "${STAGES[*]}" | sed 's/;/, /g')
echo "test_matrix: $( ((status == 0)) && echo passed || echo FAILED) in \
$SECONDS s ($summary)" >&2
exit "$status"
