"""The package's shape: a folder per concern, one home per fact, no cycles.

These hold what a reader relies on when finding their way: the tree of
`estimator_bf16/` is the table of docs/layout.md, no module is too long
to read in one sitting, imports only go one way, and a fact that several
places need (an op type, a mode string, a precision name) is spelled once.
"""

import ast
import collections
import os
import re
from unittest import mock

import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.precision import op_lists
from estimator_bf16.compat import estimator_spec as spec_lib
from estimator_bf16.compat import calling
from estimator_bf16.precision import policy

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = os.path.join(_REPO, 'estimator_bf16')
# Twelve concerns and the levers, which sit below the Estimator wrappers
# that apply them while the planner (memory/) sits above those wrappers.
MAX_ENTRIES = 13
MAX_LINES = 600


def _modules():
  """{dotted module name: path} of every module in the package."""
  found = {}
  for root, dirs, files in os.walk(_PACKAGE):
    dirs[:] = [d for d in dirs if d != '__pycache__']
    for name in files:
      if name.endswith('.py'):
        path = os.path.join(root, name)
        dotted = os.path.relpath(path[:-3], _REPO).replace(os.sep, '.')
        found[dotted[:-len('.__init__')] if dotted.endswith('__init__')
              else dotted] = path
  return found


# Where an op type must not be spelled outside op_lists: the package and the
# code that measures it. benchmarks/kernel_table.py is exempt: it is the
# measurement op_lists' CPU list cites, a table of one timed case per op type.
_OP_NAME_SCAN_DIRS = ('estimator_bf16', 'benchmarks', 'scripts')
_OP_NAME_SCAN_EXEMPT = (os.path.join('estimator_bf16', 'precision',
                                     'op_lists.py'),
                        os.path.join('benchmarks', 'kernel_table.py'))


def _op_name_scan_paths():
  """Paths of the .py files the op-name scan reads."""
  for folder in _OP_NAME_SCAN_DIRS:
    for root, dirs, files in os.walk(os.path.join(_REPO, folder)):
      dirs[:] = [d for d in dirs if d != '__pycache__']
      for name in sorted(files):
        path = os.path.join(root, name)
        if (name.endswith('.py') and
            os.path.relpath(path, _REPO) not in _OP_NAME_SCAN_EXEMPT):
          yield path


def _spelled_outside_op_lists(names, in_patterns=False):
  """'path:line 'Name'' for every string constant in `names` found.

  With `in_patterns`, also every name among the words of a pattern given to
  a `re` function (`re.compile(r'MatMul|Conv2D')`).
  """
  spelled = []
  for path in _op_name_scan_paths():
    with open(path) as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      found = []
      if isinstance(node, ast.Constant) and node.value in names:
        found = [node.value]
      elif (in_patterns and isinstance(node, ast.Call) and node.args and
            isinstance(node.func, ast.Attribute) and
            isinstance(node.func.value, ast.Name) and
            node.func.value.id == 're' and
            isinstance(node.args[0], ast.Constant) and
            isinstance(node.args[0].value, str)):
        found = sorted(set(re.findall(r'\w+', node.args[0].value)) & names)
      spelled.extend('%s:%d %r' % (os.path.relpath(path, _REPO),
                                   node.lineno, name) for name in found)
  return spelled


# Strings that equal a registered op type but name something else.
_NOT_OP_TYPES = {
    (os.path.join('estimator_bf16', 'memory', 'fit.py'), 'B'):
        'the unit of bytes in a size such as 512B',
    (os.path.join('estimator_bf16', 'platform', 'slim_repair.py'), 'Assert'):
        'the module attribute tf-slim reads, tf.compat.v1.Assert',
}


def op_types_spelled(paths, root):
  """'path:line 'Name'' for each string in `paths` that is an op type.

  A string constant (docstrings aside) equal to a registered TensorFlow op
  type is one, unless `_NOT_OP_TYPES` says it names something else there.
  """
  from tensorflow.python.framework import op_def_registry  # pylint: disable=g-import-not-at-top
  spelled = []
  for path in paths:
    relative = os.path.relpath(path, root)
    with open(path) as f:
      tree = ast.parse(f.read())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef,
                                       ast.FunctionDef)) and node.body and
                  isinstance(node.body[0], ast.Expr)}
    for node in ast.walk(tree):
      if (isinstance(node, ast.Constant) and isinstance(node.value, str) and
          id(node) not in docstrings and node.value and
          (relative, node.value) not in _NOT_OP_TYPES and
          op_def_registry.get(node.value) is not None):
        spelled.append('%s:%d %r' % (relative, node.lineno, node.value))
  return spelled


def _repository_python(*folders):
  """Paths of the .py files under the repository's `folders`."""
  for folder in folders:
    for root, dirs, files in os.walk(os.path.join(_REPO, folder)):
      dirs[:] = sorted(d for d in dirs if d != '__pycache__')
      for name in sorted(files):
        if name.endswith('.py'):
          yield os.path.join(root, name)


def _package_paths():
  """The package's .py files but op_lists.py, the one home of op types."""
  home = os.path.join(_PACKAGE, 'precision', 'op_lists.py')
  return sorted(path for path in _modules().values() if path != home)


def _layout_section(doc):
  """The layout table of docs/layout.md, from its header row to its end."""
  section = doc[doc.index('| Where | What |'):]
  end = section.find('\n\n')
  return section if end < 0 else section[:end]


def _layout_doc():
  with open(os.path.join(_REPO, 'docs', 'layout.md')) as f:
    return f.read()


def _layer_order(doc):
  """Top-level folders of the package in the layout table's order."""
  order = []
  for folder in re.findall(r'^\| `estimator_bf16/(\w+)/[\w/]*` \|',
                           _layout_section(doc), re.M):
    if folder not in order:
      order.append(folder)
  return order


def _all_imports(path):
  """(line, dotted name) of every package import in `path`, anywhere.

  `from estimator_bf16.x import y` gives 'estimator_bf16.x.y', so a folder
  imported by name (`from estimator_bf16 import compat`) counts as that
  folder; imports inside functions count as well as module-level ones.
  """
  with open(path) as f:
    tree = ast.parse(f.read())
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and (
        node.level == 0 and node.module.split('.')[0] == 'estimator_bf16'):
      found.extend((node.lineno, node.module + '.' + alias.name)
                   for alias in node.names)
    elif isinstance(node, ast.Import):
      found.extend((node.lineno, alias.name) for alias in node.names
                   if alias.name.split('.')[0] == 'estimator_bf16')
  return found


def layer_violations(package, order):
  """Imports that climb from a folder to one later in `order`.

  Args:
    package: str, the package's folder.
    order: list of its top-level folders, lowest layer first.

  Returns:
    list of 'path:line imports name' strings. The package itself
    (`import estimator_bf16`, the public API) sits at the layer of the
    highest folder its `__init__.py` imports.
  """
  level = {folder: i for i, folder in enumerate(order)}

  def folder_of(dotted):
    parts = dotted.split('.')
    return parts[1] if len(parts) > 1 and parts[1] in level else None

  api = max((level[folder_of(name)]
             for _, name in _all_imports(os.path.join(package, '__init__.py'))
             if folder_of(name)), default=-1)
  found = []
  for root, dirs, files in os.walk(package):
    dirs[:] = [d for d in dirs if d != '__pycache__']
    rel = os.path.relpath(root, package).split(os.sep)[0]
    if rel not in level:
      continue  # The package's own __init__ / __main__ are the top.
    for name in sorted(f for f in files if f.endswith('.py')):
      path = os.path.join(root, name)
      for line, dotted in _all_imports(path):
        target = folder_of(dotted)
        target_level = level[target] if target else api
        if target_level > level[rel]:
          found.append('%s:%d imports %s' % (
              os.path.relpath(path, os.path.dirname(package)), line, dotted))
  return found


def _module_level_imports(path, modules):
  """Package modules `path` imports at module level (not inside functions)."""
  with open(path) as f:
    tree = ast.parse(f.read())
  found = set()
  for node in tree.body:
    if isinstance(node, ast.ImportFrom) and node.module and (
        node.module.startswith('estimator_bf16')):
      for alias in node.names:
        candidate = node.module + '.' + alias.name
        found.add(candidate if candidate in modules else node.module)
    elif isinstance(node, ast.Import):
      found.update(a.name for a in node.names
                   if a.name.startswith('estimator_bf16.'))
  return found


MAX_FUNCTION_LINES = 80
MAX_PUBLIC_PARAMETERS = 12
# Functions exempt from the two limits above, each with its reason.
_WIDE_EXEMPT = {
    # Argument parsers: one statement per flag, read as a table.
    'estimator_bf16/apps/cli.py:build_parser': 'argument parser',
    'estimator_bf16/apps/train_cli.py:define_flags': 'argument parser',
    # The compat backend reproduces TensorFlow's own constructors, argument
    # for argument, so that code written for tf.estimator runs unchanged.
    'estimator_bf16/compat/config.py:RunConfig.__init__': "TensorFlow's API",
    'estimator_bf16/compat/tpu_estimator.py:TPUEstimator.__init__':
        "TensorFlow's API",
}


def wide_functions(paths, root):
  """'path:Qualified.name: why' for each function over the size limits.

  A function is too long over `MAX_FUNCTION_LINES` lines (docstring
  included); a public one (no leading underscore, or `__init__` of a public
  class) takes too much over `MAX_PUBLIC_PARAMETERS` parameters, `self` and
  `cls` not counted.
  """
  found = []

  def visit(node, path, prefix, public):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, ast.ClassDef):
        visit(child, path, prefix + child.name + '.',
              public and not child.name.startswith('_'))
      elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        name = prefix + child.name
        key = '%s:%s' % (path, name)
        visit(child, path, name + '.', False)
        if key in _WIDE_EXEMPT:
          continue
        args = child.args
        params = [a.arg for a in args.posonlyargs + args.args +
                  args.kwonlyargs] + [a.arg for a in (args.vararg,
                                                      args.kwarg) if a]
        params = [p for p in params if p not in ('self', 'cls')]
        lines = child.end_lineno - child.lineno + 1
        if lines > MAX_FUNCTION_LINES:
          found.append('%s: %d lines' % (key, lines))
        is_public = public and (not child.name.startswith('_') or
                                child.name == '__init__')
        if is_public and len(params) > MAX_PUBLIC_PARAMETERS:
          found.append('%s: %d parameters' % (key, len(params)))

  for path in paths:
    with open(path) as f:
      tree = ast.parse(f.read())
    visit(tree, os.path.relpath(path, root).replace(os.sep, '/'), '', True)
  return sorted(found)


class LayoutTest(tf.test.TestCase):

  def test_the_package_has_a_short_list_of_folders(self):
    entries = sorted(e for e in os.listdir(_PACKAGE)
                     if e not in ('__init__.py', '__main__.py', '__pycache__'))
    self.assertLessEqual(len(entries), MAX_ENTRIES, entries)
    # Folders only: every module belongs to a concern.
    self.assertEqual([e for e in entries
                      if not os.path.isdir(os.path.join(_PACKAGE, e))], [])

  def test_no_module_is_too_long_to_read(self):
    long_ones = {}
    for name, path in _modules().items():
      with open(path) as f:
        lines = sum(1 for _ in f)
      if lines > MAX_LINES:
        long_ones[name] = lines
    self.assertEqual(long_ones, {})

  def test_no_function_is_too_long_or_too_wide(self):
    self.assertEqual(
        wide_functions(sorted(_modules().values()), _REPO), [])

  def test_the_function_check_sees_a_long_and_a_wide_function(self):
    path = os.path.join(self.create_tempdir().full_path, 'wide.py')
    body = '\n'.join('  x%d = %d' % (i, i) for i in range(80))
    with open(path, 'w') as f:
      f.write('def long():\n%s\n\n' % body)
      f.write('def wide(%s):\n  pass\n\n' %
              ', '.join('a%d' % i for i in range(13)))
      f.write('def _private_wide(%s):\n  pass\n\n' %
              ', '.join('a%d' % i for i in range(13)))
      f.write('class Public:\n  def __init__(self, %s):\n    pass\n' %
              ', '.join('a%d' % i for i in range(13)))
    self.assertEqual(wide_functions([path], os.path.dirname(path)), [
        'wide.py:Public.__init__: 13 parameters',
        'wide.py:long: 81 lines',
        'wide.py:wide: 13 parameters'])

  def test_imports_have_no_cycles(self):
    modules = _modules()
    graph = {name: _module_level_imports(path, modules) & set(modules)
             for name, path in modules.items()}
    # A package's __init__ runs before its modules; `estimator_bf16` itself
    # re-exports the public API, so edges into it are the public surface.
    for name in graph:
      graph[name].discard('estimator_bf16')
    state = collections.defaultdict(int)  # 0 new, 1 on the path, 2 done
    cycles = []

    def visit(node, path):
      state[node] = 1
      for nxt in sorted(graph.get(node, ())):
        if state[nxt] == 1:
          cycles.append(path[path.index(nxt):] + [nxt])
        elif state[nxt] == 0:
          visit(nxt, path + [nxt])
      state[node] = 2

    for name in sorted(graph):
      if state[name] == 0:
        visit(name, [name])
    self.assertEqual(cycles, [])

  def test_folders_form_layers_in_the_layout_table_order(self):
    order = _layer_order(_layout_doc())
    folders = sorted(e for e in os.listdir(_PACKAGE)
                     if os.path.isdir(os.path.join(_PACKAGE, e)) and
                     e != '__pycache__')
    self.assertCountEqual(order, folders)
    self.assertEqual(layer_violations(_PACKAGE, order), [])

  def test_the_layer_check_sees_an_import_inside_a_function(self):
    # A lower folder reaching up from inside a function is caught; the
    # same import the other way is allowed.
    package = os.path.join(self.create_tempdir().full_path, 'estimator_bf16')
    for folder in ('low', 'high'):
      os.makedirs(os.path.join(package, folder))
    with open(os.path.join(package, '__init__.py'), 'w') as f:
      f.write('from estimator_bf16.low import a\n')
    with open(os.path.join(package, 'low', 'a.py'), 'w') as f:
      f.write('def later():\n  from estimator_bf16.high import b\n')
    with open(os.path.join(package, 'high', 'b.py'), 'w') as f:
      f.write('from estimator_bf16.low import a\nimport estimator_bf16\n')
    self.assertEqual(layer_violations(package, ['low', 'high']),
                     ['estimator_bf16/low/a.py:2 imports estimator_bf16.high.b'])
    self.assertEqual(layer_violations(package, ['high', 'low']), [
        'estimator_bf16/high/b.py:1 imports estimator_bf16.low.a',
        'estimator_bf16/high/b.py:2 imports estimator_bf16'])

  def test_layout_table_names_every_folder_and_module(self):
    self.assertEqual(layout_problems(_layout_section(_layout_doc()), _PACKAGE),
                     [])

  def test_the_layout_check_sees_an_unlisted_and_a_missing_module(self):
    package = os.path.join(self.create_tempdir().full_path, 'estimator_bf16')
    for name in ('__init__.py', '__main__.py', 'levers/__init__.py',
                 'levers/apply.py', 'levers/recompute.py',
                 'models/styles/keras_style.py', 'models/head.py'):
      os.makedirs(os.path.dirname(os.path.join(package, name)),
                  exist_ok=True)
      open(os.path.join(package, name), 'w').close()
    os.makedirs(os.path.join(package, 'safety'))
    section = '\n'.join((
        '| `estimator_bf16/` | `__init__.py`, `__main__.py` |',
        '| `estimator_bf16/levers/` | `apply.py`, `accumulation.py` |',
        '| `estimator_bf16/models/` | `head.py`, `styles/` |'))
    self.assertEqual(layout_problems(section, package), [
        'estimator_bf16/safety/ has no row',
        'estimator_bf16/levers/accumulation.py is named but does not exist',
        'estimator_bf16/levers/recompute.py is not named in its row'])


def layout_problems(section, package_dir):
  """What breaks "the layout table names every folder and module", as strings.

  Args:
    section: the table's Markdown: rows `| `estimator_bf16/FOLDER/` | ... |`
      naming modules as `name.py`, relative to the row's folder, and a
      sub-folder without a row of its own as `sub/`.
    package_dir: the package's folder on disk.
  """
  rows = dict(re.findall(r'^\| `estimator_bf16/([\w/]*)` \|(.*)$', section,
                         re.M))
  problems = []
  for root, dirs, files in os.walk(package_dir):
    dirs[:] = sorted(d for d in dirs if d != '__pycache__')
    folder = os.path.relpath(root, package_dir).replace(os.sep, '/')
    folder = '' if folder == '.' else folder + '/'
    # The deepest folder with a row of its own holds this one's modules.
    owner = folder
    while owner and owner not in rows:
      owner = owner[:owner.rstrip('/').rfind('/') + 1]
    if owner not in rows or (owner != folder and folder.count('/') == 1):
      problems.append('estimator_bf16/%s has no row' % folder)
      continue
    for name in sorted(files):
      if not name.endswith('.py') or (name == '__init__.py' and folder):
        continue
      relative = folder[len(owner):] + name
      named = ('`%s`' % relative in rows[owner] or
               '`%s/`' % relative.split('/')[0] in rows[owner])
      if not named:
        problems.append('estimator_bf16/%s%s is not named in its row' %
                        (folder, name))
  # The package's own row is prose about the whole repository.
  for owner, text in sorted(rows.items()):
    if not owner:
      continue
    for module in re.findall(r'`([\w/]+\.py)`', text):
      if not os.path.exists(os.path.join(package_dir, owner, module)):
        problems.append('estimator_bf16/%s%s is named but does not exist' %
                        (owner, module))
  return sorted(problems, key=lambda p: ('has no row' not in p, p))


# The tests that are about the repository as a whole rather than one
# package folder: they stay at the top of tests/.
_REPOSITORY_TESTS = ('test_benchmark.py', 'test_corpus.py',
                     'test_docs_api.py', 'test_docs_commands.py',
                     'test_packaging.py',
                     'test_structure.py', 'test_suite_setup.py')


def mirror_problems(tests_dir, package_dir):
  """What breaks "tests/ mirrors the package" in `tests_dir`, as strings.

  Each folder of `tests_dir` but `support/` is named for a folder of
  `package_dir` and holds only test modules; helpers live in `support/`;
  the top holds the repository-wide tests, conftest.py and plugins only.
  """
  problems = []
  folders = {e for e in os.listdir(package_dir)
             if os.path.isdir(os.path.join(package_dir, e)) and
             e != '__pycache__'}
  for entry in sorted(os.listdir(tests_dir)):
    path = os.path.join(tests_dir, entry)
    if entry == '__pycache__':
      continue
    if os.path.isdir(path):
      if entry == 'support':
        continue
      if entry not in folders:
        problems.append('tests/%s/ names no package folder' % entry)
        continue
      for name in sorted(os.listdir(path)):
        if name.endswith('.py') and not (name.startswith('test_') or
                                         name == '__init__.py'):
          problems.append('tests/%s/%s is not a test module (helpers go '
                          'in tests/support/)' % (entry, name))
    elif entry.startswith('test_') and entry not in _REPOSITORY_TESTS:
      problems.append('tests/%s belongs in the folder of the package '
                      'folder it tests' % entry)
  return problems


class OneNamePerModuleTest(tf.test.TestCase):

  def test_each_module_is_imported_under_one_name(self):
    # `from estimator_bf16.memory import fit as fit_lib` everywhere, or
    # `fit` everywhere: a reader learns one name per module. The public
    # API's __init__ may bind a module privately (`_quiet`).
    # The tests, benchmarks and scripts use the package's names too.
    names = collections.defaultdict(set)
    modules = _modules()
    readers = sorted(modules.items()) + [
        (None, path) for path in _repository_python('tests', 'benchmarks',
                                                    'scripts')]
    for dotted, path in readers:
      with open(path) as f:
        tree = ast.parse(f.read())
      for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (
            node.module or '').startswith('estimator_bf16'):
          pairs = [(node.module + '.' + a.name, a.asname or a.name)
                   for a in node.names]
        elif isinstance(node, ast.Import):
          pairs = [(a.name, a.asname or a.name) for a in node.names
                   if a.name.startswith('estimator_bf16')]
        else:
          continue
        for imported, name in pairs:
          if imported in modules and not (
              dotted == 'estimator_bf16' and name.startswith('_')):
            names[imported].add(name)
    self.assertEqual({module: sorted(bound) for module, bound in names.items()
                      if len(bound) > 1}, {})


class BenchmarksIndexTest(tf.test.TestCase):

  def test_the_benchmarks_docstring_lists_exactly_its_modules(self):
    import benchmarks  # pylint: disable=g-import-not-at-top
    listed = set(re.findall(r'^- `(\w+)`', benchmarks.__doc__, re.M))
    folder = os.path.join(_REPO, 'benchmarks')
    have = {name[:-3] for name in os.listdir(folder)
            if name.endswith('.py') and name != '__init__.py'}
    self.assertEqual(listed, have)


class TestsMirrorThePackageTest(tf.test.TestCase):
  """tests/ mirrors the package: the test of levers/recompute.py is
  tests/levers/test_recompute.py."""

  def test_tests_mirror_the_package(self):
    self.assertEqual(
        mirror_problems(os.path.join(_REPO, 'tests'), _PACKAGE), [])

  def test_the_mirror_check_sees_a_stray_file_and_folder(self):
    root = self.create_tempdir().full_path
    package, tests = os.path.join(root, 'pkg'), os.path.join(root, 'tests')
    os.makedirs(os.path.join(package, 'levers'))
    for folder in ('levers', 'lever', 'support'):
      os.makedirs(os.path.join(tests, folder))
    for name in ('levers/test_recompute.py', 'levers/models.py',
                 'support/models.py', 'test_recompute.py', 'conftest.py',
                 'test_structure.py'):
      open(os.path.join(tests, name), 'w').close()
    self.assertEqual(mirror_problems(tests, package), [
        'tests/lever/ names no package folder',
        'tests/levers/models.py is not a test module (helpers go in '
        'tests/support/)',
        'tests/test_recompute.py belongs in the folder of the package '
        'folder it tests'])


class OneHomePerFactTest(tf.test.TestCase):

  def test_matmul_conv_and_variable_op_names_only_in_op_lists(self):
    self.assertEqual(_spelled_outside_op_lists(
        op_lists.MATMUL_CONV_OPS | op_lists.BFLOAT16_OPS |
        op_lists.VARIABLE_OPS, in_patterns=True), [])

  def test_shared_op_families_only_in_op_lists(self):
    # Op types that several modules classify the same way.
    self.assertEqual(_spelled_outside_op_lists(
        op_lists.VARIABLE_READ_OPS | op_lists.FLOAT32_KEEP_DTYPE_OPS |
        op_lists.BATCH_NORM_OPS | op_lists.BATCH_NORM_GRAD_OPS |
        op_lists.CONTROL_FLOW_OPS | op_lists.REF_CONTROL_FLOW_OPS), [])

  def test_one_mebibyte(self):
    # MiB has one home, platform/tpu.py, beside GiB; the rest import it.
    spelled = re.compile(r'\b2(\.0)? *\*\* *20\b|^\s*MiB\s*=', re.M)
    home = os.path.join('estimator_bf16', 'platform', 'tpu.py')
    found = []
    for path in _op_name_scan_paths():
      with open(path) as f:
        if spelled.search(f.read()):
          found.append(os.path.relpath(path, _REPO))
    self.assertEqual(found, [home])

  def test_no_op_type_spelled_outside_op_lists(self):
    self.assertEqual(op_types_spelled(_package_paths(), _REPO), [])

  def test_the_op_type_scan_sees_a_comparison_and_a_list(self):
    folder = self.create_tempdir().full_path
    path = os.path.join(folder, 'module.py')
    with open(path, 'w') as f:
      f.write('"""Cast."""\n_OPS = frozenset([\'Relu\', \'relu\'])\n'
              'def f(op):\n  """Mul."""\n  return op.type == \'Cast\'\n')
    self.assertEqual(op_types_spelled([path], folder),
                     ["module.py:2 'Relu'", "module.py:5 'Cast'"])

  def test_the_op_name_scan_reads_benchmarks_and_scripts(self):
    scanned = {os.path.relpath(path, _REPO).split(os.sep)[0]
               for path in _op_name_scan_paths()}
    self.assertEqual(scanned, {'estimator_bf16', 'benchmarks', 'scripts'})

  def test_op_lists_name_registered_ops(self):
    from tensorflow.python.framework import op_def_registry  # pylint: disable=g-import-not-at-top
    lists = [value for name, value in vars(op_lists).items()
             if name.isupper() and isinstance(value, frozenset)]
    lists.append(frozenset(vars(op_lists.OP).values()))
    unknown = sorted(
        op for ops in lists for op in ops
        # Grappler's fused ops exist only in the optimized graph.
        if not op.startswith('_') and op_def_registry.get(op) is None)
    self.assertEqual(unknown, [])

  def test_autocast_bfloat16_ops_are_counted_by_the_audit(self):
    # What autocast puts in bfloat16 is what the audit's FLOP share counts.
    self.assertEqual(
        op_lists.BFLOAT16_OPS - op_lists.MATMUL_CONV_OPS, frozenset())

  def test_mode_strings_agree_with_both_backends(self):
    self.assertEqual((spec_lib.ModeKeys.TRAIN, spec_lib.ModeKeys.EVAL,
                      spec_lib.ModeKeys.PREDICT),
                     (calling.TRAIN, calling.EVAL, calling.PREDICT))
    estimator_module = getattr(tf.compat.v1, 'estimator', None)
    if eb.BACKEND == 'tf_estimator' and estimator_module is not None:
      keys = estimator_module.ModeKeys
      self.assertEqual((keys.TRAIN, keys.EVAL, keys.PREDICT),
                       (calling.TRAIN, calling.EVAL, calling.PREDICT))


class PrecisionParsedOnceTest(tf.test.TestCase):

  def test_a_precision_is_a_checked_name(self):
    value = policy.parse_precision('bfloat16')
    self.assertIsInstance(value, policy.Precision)
    self.assertEqual(value, 'bfloat16')
    self.assertTrue(value.bfloat16)
    self.assertEqual(value.compute_dtype, tf.bfloat16)
    self.assertIs(policy.parse_precision(value), value)
    self.assertFalse(policy.parse_precision('float32').bfloat16)
    with self.assertRaisesRegex(ValueError, "'float32', 'bfloat16'"):
      policy.parse_precision('fp16')

  def test_the_precisions_are_listed_once(self):
    # A tuple, list, set or dict of both names is a second list (or map)
    # of precisions: it belongs in precision/policy.py alone.
    # The package and the code that measures it (the op-name scan's files:
    # kernel_table.py names kernel dtypes, not precisions).
    home = os.path.join(_PACKAGE, 'precision', 'policy.py')
    found = []
    for path in _op_name_scan_paths():
      if path == home:
        continue
      with open(path) as f:
        tree = ast.parse(f.read())
      for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
          items = [key for key in node.keys if key is not None]
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
          items = node.elts
        else:
          continue
        names = {item.value for item in items
                 if isinstance(item, ast.Constant)}
        if set(policy.PRECISIONS) <= names:
          found.append('%s:%d' % (os.path.relpath(path, _REPO), node.lineno))
    self.assertEqual(found, [])

  def test_make_tpu_estimator_parses_the_precision_once(self):
    original = policy.Precision.__new__
    made = []

    def counting_new(cls, name):
      made.append(name)
      return original(cls, name)

    def model_fn(features, labels, mode, params):
      del labels, mode, params
      return features

    with mock.patch.object(policy.Precision, '__new__', counting_new):
      eb.make_tpu_estimator(
          model_fn, model_dir=self.get_temp_dir(), precision='bfloat16',
          train_batch_size=8)
    self.assertEqual(made, ['bfloat16'])
