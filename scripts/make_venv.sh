#!/usr/bin/env bash
# Creates (or refreshes) a pinned virtualenv with the package installed in
# editable mode. Does nothing when DIR/.installed is newer than both the
# requirements file and setup.py.
#
# Usage: scripts/make_venv.sh DIR REQUIREMENTS    (PYTHON=python3.11 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
dir="$1"
requirements="$2"
stamp="$dir/.installed"
if [[ -f "$stamp" && ! "$requirements" -nt "$stamp" && ! setup.py -nt "$stamp" ]]; then
  exit 0
fi
python="${PYTHON:-python3.11}"
if ! command -v "$python" >/dev/null; then
  echo "make_venv: $python not found; TensorFlow 2.15 needs Python 3.9-3.11 (set PYTHON=...)." >&2
  exit 1
fi
echo "make_venv: creating $dir from $requirements" >&2
"$python" -m venv "$dir"
"$dir/bin/pip" install --quiet --upgrade pip==24.3.1
"$dir/bin/pip" install --quiet -r "$requirements"
"$dir/bin/pip" install --quiet --no-deps -e .
touch "$stamp"
