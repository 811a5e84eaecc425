"""Fixtures for the MCP server's tests: `evervm mcp` on stdio and `evervm serve`'s `/mcp`, both
on gVisor with the data image (fork, checkpoints and plots need them), driven by the official
MCP Python SDK."""

import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Iterator

import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "support"))
import evervm_serve  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def needs_gvisor() -> None:
    reason = evervm_serve.gvisor_reason()
    if reason and os.environ.get("CI"):
        pytest.fail(f"the MCP tests must run in CI, but {reason}")
    if reason:
        pytest.skip(reason)


Server = evervm_serve.Server


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    s = Server("gvisor", "evervm-mcp-")
    yield s
    s.stop()


class Connect:
    """Opens an MCP client on one transport: `stdio` (a new `evervm mcp` on a fresh home) or
    `http` (the session's server)."""

    def __init__(self, transport: str, server: Server | None, home: Path) -> None:
        self.transport, self.server, self.home = transport, server, home

    @asynccontextmanager
    async def __call__(self, mode: str = "auto") -> AsyncIterator[Client]:
        if self.transport == "stdio":
            target = StdioServerParameters(
                command=str(evervm_serve.evervm_binary()),
                args=["mcp", "--home", str(self.home), "--backend", "gvisor"],
                env={**os.environ, "EVERVM_POOL_SIZE": "1"},
            )
            async with Client(target, mode=mode) as client:
                yield client
        else:
            assert self.server is not None
            http = httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {self.server.token}"}, timeout=120)
            async with http:
                target = streamable_http_client(f"{self.server.url}/mcp", http_client=http)
                async with Client(target, mode=mode) as client:
                    yield client


@pytest.fixture(params=["stdio", "http"])
def connect(request: pytest.FixtureRequest, tmp_path: Path) -> Connect:
    server = request.getfixturevalue("server") if request.param == "http" else None
    return Connect(request.param, server, tmp_path / "home")
