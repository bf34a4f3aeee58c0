"""Every call of the library the README and docs/ show takes what they pass.

A reader copies `eb.make_tpu_estimator(..., options=...)` from a table or a
```python block. The shell blocks are run by test_docs_commands.py; the
Python ones need a model, data and minutes, so here each call of a public
name of `estimator_bf16` (`eb.NAME(...)`, or `NAME(...)` of a name in
`eb.__all__`) is read as code and bound against the real signature: every
keyword must be one the function takes, and the positional arguments must
fit unless the call elides some with `...`. A signature written out
(`eb.f(a, *, b, c=1)`, which does not parse as a call) must name the
function's parameters, all of them, in order.
"""

import ast
import glob
import inspect
import os
import re

import tensorflow as tf

import estimator_bf16 as eb

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DOCS = ['README.md', 'models/README.md'] + sorted(
    os.path.relpath(p, _REPO) for p in glob.glob(os.path.join(_REPO, 'docs',
                                                              '*.md')))
_PYTHON_BLOCK = re.compile(r'^```python\n(.*?)^```', re.S | re.M)
_OTHER_BLOCK = re.compile(r'^```(?!python\n).*?^```', re.S | re.M)
# Inline code may wrap onto the next line, never over a blank one.
_INLINE = re.compile(r'`((?:[^`\n]|\n(?!\n))+)`')
# Spans that show a choice with `|` rather than code: (document, start).
_NOT_CODE = {('docs/api.md', "eb.make_strategy('mirrored' \\| "
                             "'multi_worker'")}


def _callables():
  return {name: getattr(eb, name) for name in eb.__all__
          if callable(getattr(eb, name)) and
          not isinstance(getattr(eb, name), type(eb))}


def _snippets(text):
  """(line, code) of each ```python block and inline code span of `text`."""
  for match in _PYTHON_BLOCK.finditer(text):
    yield text[:match.start()].count('\n') + 2, match.group(1)
  # Other fenced blocks (shell, transcripts) are not Python.
  blanked = _OTHER_BLOCK.sub(lambda m: '\n' * m.group(0).count('\n'),
                             _PYTHON_BLOCK.sub(
                                 lambda m: '\n' * m.group(0).count('\n'),
                                 text))
  for match in _INLINE.finditer(blanked):
    yield (blanked[:match.start()].count('\n') + 1,
           match.group(1).replace('\n', ' '))


def _called_name(node, names):
  func = node.func
  if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
      and func.value.id == 'eb'):
    return func.attr
  if isinstance(func, ast.Name) and func.id in names:
    return func.id
  return None


def call_problems(document, text, functions):
  """What in `text` calls a function of `functions` wrongly, as strings."""
  problems = []
  for line, code in _snippets(text):
    if not re.search(r'(\beb\.\w+|\b(%s))\(' % '|'.join(functions), code):
      continue
    code = code.strip()
    try:
      tree = ast.parse(code)
    except SyntaxError:
      problems.extend(_signature_problems(document, line, code, functions))
      continue
    for node in ast.walk(tree):
      if not isinstance(node, ast.Call):
        continue
      name = _called_name(node, functions)
      if name is None:
        continue
      if name not in functions:
        problems.append('%s:%d: eb.%s does not exist' %
                        (document, line, name))
        continue
      elided = any(isinstance(a, ast.Constant) and a.value is Ellipsis
                   for a in node.args)
      positional = [] if elided else [None] * len(node.args)
      try:
        inspect.signature(functions[name]).bind_partial(
            *positional, **{k.arg: None for k in node.keywords if k.arg})
      except TypeError as e:
        problems.append('%s:%d: %s: %s' % (document, line, name, e))
  return problems


def _signature_problems(document, line, code, functions):
  """A written-out signature `eb.f(a, *, b=1)` against the real one."""
  match = re.match(r'(?:eb\.)?(\w+)(\(.*\))$', code)
  if match is None or any(document == d and code.startswith(start)
                          for d, start in _NOT_CODE):
    return []
  name = match.group(1)
  try:
    written = ast.parse('def %s%s: pass' % (name, match.group(2))).body[0]
  except SyntaxError:
    return ['%s:%d: neither a call nor a signature: %s' %
            (document, line, code)]
  args = written.args
  names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
  if name not in functions:
    return ['%s:%d: eb.%s does not exist' % (document, line, name)]
  real = list(inspect.signature(functions[name]).parameters)
  if names != real:
    return ['%s:%d: %s takes (%s), the document says (%s)' % (
        document, line, name, ', '.join(real), ', '.join(names))]
  return []


class DocsApiTest(tf.test.TestCase):

  def test_every_documented_call_fits_its_signature(self):
    functions = _callables()
    problems, read = [], 0
    for document in _DOCS:
      with open(os.path.join(_REPO, document)) as f:
        text = f.read()
      read += len(re.findall(r'\beb\.\w+\(', text))
      problems += call_problems(document, text, functions)
    self.assertEqual(problems, [])
    self.assertGreater(read, 40)  # The documents do show the library.

  def test_the_check_sees_a_stale_keyword_and_a_stale_signature(self):
    functions = _callables()
    text = '\n'.join((
        "Call `eb.make_tpu_estimator(...,\nnumeric_guard=True)` or",
        '```python',
        "wrapped = eb.wrap_model_fn(model_fn, 'bfloat16', audit='warn')",
        '```',
        '| `eb.make_tpu_estimator(model_fn, *, model_dir, audit)` | it |',
        "and `make_tpu_estimator(model_fn, model_dir='m', precision='float32',"
        ' train_batch_size=8)` is fine; `eb.nothing_here(1)` is not.',
        '```sh',
        "eb.wrap_model_fn(model_fn, 'bfloat16', audit='warn')",
        '```'))
    problems = call_problems('doc.md', text, functions)
    self.assertEqual(len(problems), 4, problems)
    self.assertIn("doc.md:4: wrap_model_fn: got an unexpected keyword "
                  "argument 'audit'", problems)
    self.assertIn("doc.md:1: make_tpu_estimator: got an unexpected keyword "
                  "argument 'numeric_guard'", problems)
    self.assertIn('doc.md:6: make_tpu_estimator takes (model_fn, model_dir, '
                  'precision, train_batch_size, eval_batch_size, '
                  'predict_batch_size, params, use_tpu, tpu, distribute, '
                  'options, estimator_options), the document says (model_fn, '
                  'model_dir, audit)', problems)
    self.assertIn('doc.md:7: eb.nothing_here does not exist', problems)


if __name__ == '__main__':
  tf.test.main()
