"""The type stubs match the native module (mypy's stubtest)."""

import subprocess
import sys
from pathlib import Path


def test_stubs_match_the_native_module() -> None:
    allowlist = Path(__file__).with_name("stubtest-allowlist.txt")
    checked = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "evervm._native", "--allowlist", str(allowlist)],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
