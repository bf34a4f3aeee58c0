"""Where the repository is, for tests that run its files as a user would."""

import os

# tests/support/paths.py -> the repository root.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
