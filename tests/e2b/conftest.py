"""Fixtures for the E2B SDK tests: `evervm serve --e2b-listen` on gVisor (the data image: pandas
and matplotlib), and the environment that points E2B's unmodified SDKs at it."""

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "support"))
import evervm_serve  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def needs_gvisor() -> None:
    reason = evervm_serve.gvisor_reason()
    if reason and os.environ.get("CI"):
        pytest.fail(f"the E2B SDK tests must run in CI, but {reason}")
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def e2b_server() -> Iterator[evervm_serve.Server]:
    """The server, with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing the SDKs at it
    (the three variables a user sets to switch)."""
    server = evervm_serve.Server("gvisor", "evervm-e2b-", e2b=True)
    saved = {k: os.environ.get(k) for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")}
    os.environ["E2B_API_URL"] = server.e2b_url
    os.environ["E2B_SANDBOX_URL"] = server.e2b_url
    os.environ["E2B_API_KEY"] = server.e2b_key
    yield server
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.stop()
