"""Cloud TPU job submission: the `tpu-submit` program (`main`).

Modules, by what they do:
  main: the program; `python -m estimator_bf16.apps.tpu_submit` runs it.
  arguments: the command line (argparse), one parser per subcommand.
  validation: checks that run before any gcloud call (exit code 2).
  tpu_vm, vertex, ai_platform: the three paths and their gcloud commands.
  packaging: the trainer sdist built from setup.py.
  common, command_runner: shared gcloud argv building; running or printing
    commands.
"""
