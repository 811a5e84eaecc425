"""The Swift package's FFI surface, driven through uniffi's Python bindings generated from the
same library (there is no Swift compiler here): `scripts/generate.sh DIR` writes them and the
library into DIR, given to the tests as EVERVM_FFI_DIR. The server is `evervm serve` on gVisor
(forks and checkpoints need it)."""

import importlib
import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "support"))
import evervm_serve  # noqa: E402


@pytest.fixture(scope="session")
def ffi():
    directory = os.environ.get("EVERVM_FFI_DIR")
    if not directory:
        pytest.fail("EVERVM_FFI_DIR is not set: run bindings-swift/scripts/generate.sh DIR first")
    sys.path.insert(0, directory)
    return importlib.import_module("evervm_ffi")


Server = evervm_serve.Server


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the Swift FFI tests must run in CI, but gVisor needs root")
        pytest.skip("gVisor sandboxes need root")
    s = Server("gvisor", "evervm-swift-")
    yield s
    s.stop()
