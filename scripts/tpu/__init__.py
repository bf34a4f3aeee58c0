"""Cloud TPU job submission behind scripts/tpu_submit.py.

Modules, by what they do:
  flags: the command line (argparse), one parser per subcommand.
  validation: checks that run before any gcloud call (exit code 2).
  tpu_vm, vertex, ai_platform: the three paths and their gcloud commands.
  packaging: the trainer sdist built from setup.py.
  common, runner: shared gcloud argv building; running or printing commands.
"""
