"""Fixtures: clients of both transports (in-process, and a spawned `evervm serve`) on the
process backend, and on gVisor where it runs (fork and checkpoints need it)."""

import os
import shutil
import sys
import tempfile
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


class Server:
    """`evervm serve` on a free loopback port and a fresh home, stopped at the end."""

    def __init__(self, backend: str) -> None:
        self.home = tempfile.mkdtemp(prefix="evervm-py-")
        self.process, self.url, self.token = evervm_serve.start_serve(backend, self.home)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture(scope="session")
def process_server() -> Iterator[Server]:
    server = Server("process")
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
    server = Server("gvisor")
    yield server
    server.stop()
