"""Reads the programs of the corpus out of a repository's git directory.

`extract` copies a commit's program folders out of a git directory, blob
by blob (nothing is checked out or downloaded); `find_programs` lists the
programs of that tree that build a TPUEstimator and have a main;
`program_flags` reads the flags a program and what it imports define, so
that a recipe's flags a commit's program lacks are dropped.
"""

import os
import re
import subprocess

from scripts import corpus_recipes

# The repository `--repo` names.
TPU = 'tensorflow/tpu'
# Its program folders, the default where a caller names none.
TPU_FOLDERS = corpus_recipes.source_for(TPU).folders
_PROGRAM_MARKERS = ('TPUEstimator(',)
_MAIN_MARKERS = ('app.run(', "__name__ == '__main__'",
                 '__name__ == "__main__"')


def extract(git_dir, commit, dest, folders=TPU_FOLDERS):
  """`folders` of `commit` into `dest` ('' is the whole tree); returns the
  full commit hash.

  Blob by blob (`git cat-file --batch`), so a snapshot whose largest
  files are absent (notebooks, images) still yields the programs.
  """
  full = subprocess.run(['git', '--git-dir', git_dir, 'rev-parse', commit],
                        check=True, capture_output=True, text=True
                        ).stdout.strip()
  listing = subprocess.run(
      ['git', '--git-dir', git_dir, 'ls-tree', '-r', '-z', full, '--'] +
      ([] if '' in folders else list(folders)), check=True,
      capture_output=True).stdout.decode().split('\0')
  blobs = []
  for entry in filter(None, listing):
    meta, path = entry.split('\t', 1)
    mode, kind, sha = meta.split()
    if kind == 'blob' and mode != '120000':
      blobs.append((sha, path))
  done = subprocess.run(['git', '--git-dir', git_dir, 'cat-file', '--batch'],
                        input=''.join(sha + '\n' for sha, _ in blobs).encode(),
                        check=True, capture_output=True).stdout
  offset = 0
  for sha, path in blobs:
    end = done.index(b'\n', offset)
    header = done[offset:end].split()
    offset = end + 1
    if len(header) < 3 or header[1] != b'blob':  # 'SHA missing'
      continue
    size = int(header[2])
    target = os.path.join(dest, path)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, 'wb') as f:
      f.write(done[offset:offset + size])
    offset += size + 1
  return full


def find_programs(root, folders=TPU_FOLDERS, extra=()):
  """Paths (relative to `root`) of programs that build a TPUEstimator,
  under `folders` ('' is all of `root`), and the `extra` paths that exist
  (programs whose TPUEstimator is built by a module they import)."""
  found = [p for p in extra if os.path.isfile(os.path.join(root, p))]
  walks = [os.walk(os.path.join(root, f) if f else root) for f in folders]
  for folder, _, files in (w for walk in walks for w in walk):
    for name in sorted(files):
      if not name.endswith('.py') or name.endswith('_test.py'):
        continue
      path = os.path.join(folder, name)
      with open(path, errors='replace') as f:
        text = f.read()
      if (any(m in text for m in _PROGRAM_MARKERS) and
          any(m in text for m in _MAIN_MARKERS)):
        found.append(os.path.relpath(path, root))
  return sorted(set(found))


_DEFINE = re.compile(r'DEFINE_\w+\(\s*(?:name\s*=\s*)?[\'"](\w+)[\'"]|'
                     r'add_argument\(\s*[\'"]--([\w-]+)[\'"]')
_IMPORT = re.compile(r'^\s*(?:from\s+([\w.]+)\s+import\s+([\w, ()]+)|'
                     r'import\s+([\w.]+))', re.M)


def _module_files(name, folders):
  """Files that `import name` may load from `folders`."""
  relative = name.replace('.', os.sep)
  for folder in folders:
    for candidate in (relative + '.py', os.path.join(relative, '__init__.py')):
      path = os.path.join(folder, candidate)
      if os.path.isfile(path):
        yield path


def program_flags(program, folders):
  """Flag names DEFINE_* calls define in `program` and what it imports.

  A static reading: the program's imports (and theirs) that resolve to
  files in `folders` (its own folder, the repository's `models/`, and the
  recipe's extra paths) are scanned. Flags that other programs define are
  not the program's, and absl refuses them.
  """
  names, seen, queue = set(), set(), [program]
  while queue:
    path = queue.pop()
    if path in seen:
      continue
    seen.add(path)
    with open(path, errors='replace') as f:
      text = f.read()
    names.update(a or b for a, b in _DEFINE.findall(text))
    here = [os.path.dirname(path)] + list(folders)
    for module, imported, plain in _IMPORT.findall(text):
      candidates = [plain] if plain else [module] + [
          module + '.' + n.strip() for n in imported.strip('()').split(',')
          if n.strip()]
      for name in candidates:
        queue.extend(_module_files(name, here))
  return names


def flag_name(flag):
  """The name of a command-line flag: `--name=value` -> 'name'."""
  return flag.lstrip('-').split('=', 1)[0]
