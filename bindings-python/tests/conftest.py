"""Fixtures: clients of both transports (in-process, and a spawned `evervm serve`) on the
process backend, and on gVisor where it runs (fork and checkpoints need it)."""

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

import evervm

REPO = Path(__file__).resolve().parents[2]


def evervm_binary() -> Path:
    """The `evervm` command: EVERVM_BIN, else the workspace's debug build."""
    path = Path(os.environ.get("EVERVM_BIN", REPO / "target" / "debug" / "evervm"))
    if not path.exists():
        pytest.fail(f"{path} is missing: run `cargo build -p evervm-cli` or set EVERVM_BIN")
    return path


def gvisor_available() -> bool:
    if os.environ.get("EVERVM_TEST_BACKENDS"):
        return "gvisor" in os.environ["EVERVM_TEST_BACKENDS"].split(",")
    return shutil.which("runsc") is not None or Path("/usr/bin/runsc").exists()


class Server:
    """`evervm serve` on a free loopback port and a fresh home, stopped at the end."""

    def __init__(self, backend: str) -> None:
        self.home = tempfile.mkdtemp(prefix="evervm-py-")
        self.process = subprocess.Popen(
            [str(evervm_binary()), "serve", "--listen", "127.0.0.1:0", "--backend", backend,
             "--home", self.home],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "EVERVM_POOL_SIZE": "1"},
        )
        url = token = None
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if m := re.search(r"listening on (\S+)", line):
                url = m.group(1)
            if m := re.search(r"export EVERVM_TOKEN=(\S+)", line):
                token = m.group(1)
            if url and token:
                break
        assert url and token, "the server printed no URL and token"
        self.url, self.token = url, token

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
