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
rm -f "$stamp"
"$python" -m venv --clear "$dir"
# uv installs the pinned set in about half pip's time (it downloads and
# unpacks in parallel). It compiles the bytecode at install time as pip
# does: with PYTHONDONTWRITEBYTECODE set, nothing would cache it later, and
# every TensorFlow import of the suite would compile it again.
"$dir/bin/pip" install --quiet uv==0.13.9
uv=("$dir/bin/uv" pip install --quiet --python "$dir/bin/python")
# pip itself stays pinned: the packaging tests build a wheel with it.
"${uv[@]}" --compile-bytecode -r "$requirements" pip==24.3.1
"${uv[@]}" --no-deps -e .
touch "$stamp"
