"""Test infrastructure shared by every folder of the suite (and by `bench/`, which starts the OpenAI stub).

`REPO_ROOT` is the one place that knows where the checkout is: tests that run scripts, examples or
notebooks, or start a process from the repository root, use it instead of counting `parents` of
their own file, so moving a test module between folders changes nothing.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
