"""The Python examples in examples/python run and print what they promise."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "python"


def run(script: str, home: Path) -> str:
    env = {**os.environ, "EVERVM_HOME": str(home), "EVERVM_POOL_SIZE": "0"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script)], env=env, capture_output=True, text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_quickstart(tmp_path: Path) -> None:
    out = run("quickstart.py", tmp_path)
    assert "mean computed\nmean: 79.25\n" in out
    assert "  line: 65\n" in out and "  last value: 93\n" in out
    assert "as expected: no machine named" in out


def test_langchain_agent(tmp_path: Path) -> None:
    pytest.importorskip("langchain_core")
    out = run("langchain_agent.py", tmp_path)
    assert "The average price is 1.52." in out
