r"""Splices a benchmark run's results into docs/benchmarks.md, between markers.

    python scripts/benchmark.py --quick --out runs/bench
    python scripts/update_readme.py runs/bench

The results block ("At a glance" in docs/benchmarks.md; the README held it
once, hence the script's name) is rendered from the run's results.json by
`benchmarks.report.readme_block` (the run's `readme_block.md` holds the
same text), never typed. The block must describe a CPU with native
bfloat16 (AVX512-BF16 or AMX): on other CPUs TensorFlow emulates bfloat16,
and the document keeps the last native run, with its date and CPU.
`--allow_emulated` overrides that. `--doc` names another document.
"""

import argparse
import json
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
from benchmarks import report

BEGIN = '<!-- benchmark-results:begin (scripts/update_readme.py) -->'
END = '<!-- benchmark-results:end -->'


def splice(doc, block):
  """Returns `doc` with the text between the markers replaced by `block`.

  Raises:
    ValueError: the markers are missing or out of order.
  """
  begin, end = doc.find(BEGIN), doc.find(END)
  if begin < 0 or end < begin:
    raise ValueError('The document has no %s ... %s block.' % (BEGIN, END))
  return (doc[:begin + len(BEGIN)] + '\n' + block.rstrip('\n') + '\n' +
          doc[end:])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('out', help='The --out directory of a benchmark run.')
  parser.add_argument('--doc', '--readme', dest='doc',
                      default=os.path.join(_ROOT, 'docs', 'benchmarks.md'),
                      help='The Markdown file holding the markers.')
  parser.add_argument('--allow_emulated', action='store_true',
                      help='Also splice a run from a CPU without native '
                      'bfloat16.')
  args = parser.parse_args(argv)
  with open(os.path.join(args.out, 'results.json')) as f:
    results = json.load(f)
  env = results['env']
  native = env.get('bfloat16_kernels_native', env.get('native_bfloat16'))
  if not native and not args.allow_emulated:
    print('Not updating %s: this run (%s, %s) had no native bfloat16, so '
          'its speed figures mean nothing; the document keeps its last '
          'native run.' % (args.doc, env['cpu'], env['date']))
    return 0
  block = report.readme_block(results)
  with open(args.doc) as f:
    doc = f.read()
  with open(args.doc, 'w') as f:
    f.write(splice(doc, block))
  print('Updated %s from %s (%s).' % (args.doc, args.out, env['date']))
  return 0


if __name__ == '__main__':
  sys.exit(main())
