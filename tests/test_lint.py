"""The code passes ruff with pyproject.toml's configuration (line length 120; pycodestyle, pyflakes, import
order, bugbear, pyupgrade), so CI holds it there: the suite is what CI runs."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_code_passes_ruff():
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, (run.stdout[-6000:] + run.stderr[-2000:]
                                 + "\nfix: .venv/bin/ruff check --fix . (or by hand), or pip install -e '.[test]'")
