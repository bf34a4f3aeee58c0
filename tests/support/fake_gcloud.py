"""A stand-in for the gcloud CLI: records each call, answers from a script.

The tests copy this file into a temporary bin/gcloud (with the test's own
interpreter in the shebang), so tpu_submit runs it exactly as it would run
gcloud: as an executable, through subprocess, with no network anywhere.

Environment:
  FAKE_GCLOUD_LOG: JSON-lines file; each call appends {"argv", "stdin", "cwd"}
    where argv excludes the program name.
  FAKE_GCLOUD_RESPONSES: optional JSON file mapping a command prefix such as
    "compute tpus tpu-vm ssh" to {"exit": int, "stdout": str, "stderr": str}.
    The longest prefix of the call's leading words wins; without a match the
    call prints "fake gcloud: ok" and exits 0.
"""

import json
import os
import select
import sys


def _leading_words(argv):
  """The command path: the words before the first flag."""
  words = []
  for arg in argv:
    if arg.startswith('-'):
      break
    words.append(arg)
  return words


def _read_stdin():
  """Whatever is already waiting on stdin; never blocks on a terminal."""
  try:
    if sys.stdin is None or sys.stdin.isatty():
      return ''
    ready, _, _ = select.select([sys.stdin], [], [], 0)
    return sys.stdin.read() if ready else ''
  except (OSError, ValueError):
    return ''


def _response(argv):
  path = os.environ.get('FAKE_GCLOUD_RESPONSES')
  if not path or not os.path.exists(path):
    return {}
  with open(path) as f:
    responses = json.load(f)
  words = _leading_words(argv)
  best = {}
  best_len = -1
  for prefix, response in responses.items():
    prefix_words = prefix.split()
    if (words[:len(prefix_words)] == prefix_words
        and len(prefix_words) > best_len):
      best, best_len = response, len(prefix_words)
  return best


def main(argv):
  record = {'argv': argv, 'stdin': _read_stdin(), 'cwd': os.getcwd()}
  with open(os.environ['FAKE_GCLOUD_LOG'], 'a') as f:
    f.write(json.dumps(record) + '\n')
  response = _response(argv)
  sys.stdout.write(response.get('stdout', 'fake gcloud: ok\n'))
  sys.stderr.write(response.get('stderr', ''))
  return int(response.get('exit', 0))


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
