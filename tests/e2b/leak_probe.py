"""Runs in a venv holding an E2B Python SDK release (any, 1.0 on): creates a code-interpreter
sandbox and runs a cell, set up as docs/e2b.md tells users (E2B_API_URL, E2B_SANDBOX_URL,
E2B_API_KEY, and E2B_DOMAIN set to evervm's sink domain), while recording every host name the
process looks up and every address it connects to. Prints one JSON object: what it saw and how
far the SDK got. test_sdk_leaks.py judges it."""

import json
import socket
import sys

seen: list[list[str]] = []
real_getaddrinfo = socket.getaddrinfo
real_connect = socket.socket.connect


def recording_getaddrinfo(host, *args, **kwargs):
    seen.append(["lookup", str(host)])
    return real_getaddrinfo(host, *args, **kwargs)


def recording_connect(self, address):
    host = address[0] if isinstance(address, tuple) else str(address)
    seen.append(["connect", str(host)])
    return real_connect(self, address)


socket.getaddrinfo = recording_getaddrinfo
socket.socket.connect = recording_connect  # type: ignore[method-assign]

from importlib.metadata import version  # noqa: E402

from e2b_code_interpreter import Sandbox  # noqa: E402

outcome: dict[str, str] = {
    "e2b": version("e2b"),
    "e2b-code-interpreter": version("e2b-code-interpreter"),
}
try:
    # 2.x creates with Sandbox.create(); 1.x with the constructor.
    create = getattr(Sandbox, "create", None) or Sandbox
    sandbox = create(timeout=60)
    outcome["created"] = sandbox.sandbox_id
    try:
        execution = sandbox.run_code("print('reached')")
        outcome["ran"] = "".join(execution.logs.stdout)
    except Exception as exc:
        outcome["run_error"] = f"{type(exc).__name__}: {exc}"[:500]
    try:
        sandbox.kill()
    except Exception as exc:
        outcome["kill_error"] = f"{type(exc).__name__}: {exc}"[:500]
except Exception as exc:
    outcome["create_error"] = f"{type(exc).__name__}: {exc}"[:500]
json.dump({"seen": seen, "outcome": outcome}, sys.stdout)
