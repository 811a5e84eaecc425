"""Fixtures: clients of both transports (in-process, and a spawned `evervm serve`) on the
process backend, and on gVisor where it runs (fork and checkpoints need it)."""

import os
import shutil
import sys
from pathlib import Path
from typing import Iterator

import pytest

import evervm

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "support"))
import evervm_serve  # noqa: E402


def gvisor_available() -> bool:
    if os.environ.get("EVERVM_TEST_BACKENDS"):
        return "gvisor" in os.environ["EVERVM_TEST_BACKENDS"].split(",")
    return shutil.which("runsc") is not None or Path("/usr/bin/runsc").exists()


Server = evervm_serve.Server


@pytest.fixture(scope="session")
def process_server() -> Iterator[Server]:
    server = Server("process", "evervm-py-")
    yield server
    server.stop()


@pytest.fixture(params=["local", "remote"])
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[evervm.Client]:
    """A client on the process backend, in-process and over HTTP."""
    if request.param == "local":
        c = evervm.Client.local(home=tmp_path, backend="process", pool_size=0)
        yield c
        c.close()
    else:
        server = request.getfixturevalue("process_server")
        yield evervm.Client(server.url, server.token)


@pytest.fixture(scope="session")
def gvisor_server() -> Iterator[Server]:
    if not gvisor_available():
        pytest.skip("the gVisor backend is not available here (no runsc)")
    server = Server("gvisor", "evervm-py-")
    yield server
    server.stop()
