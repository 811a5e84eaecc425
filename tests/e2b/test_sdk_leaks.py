"""No E2B SDK release sends a sandbox's traffic, or the key, anywhere but evervm.

Releases older than those docs/e2b.md names (E2B's core before 2.7.0 sends envd traffic to
`https://49983-<id>.<domain>`; its code interpreter before 2.9.0 sends the cell's code there
on any core; before 2.3.4 the core ignores E2B_API_URL) run leak_probe.py, set up as the book
tells users, with every lookup and connection recorded: each must reach only evervm's
listener, whether evervm refuses the SDK at create or the SDK fails closed on the sink domain
evervm answers.

The Python releases come from EVERVM_E2B_LEAK_PYTHONS: Python executables of venvs that hold
them (scripts/test.sh makes them); the JS releases from js-leaks/ (`npm ci` there). Skipped
without them, except in CI."""

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

HERE = Path(__file__).parent
JS_PACKAGES = HERE / "js-leaks"


def probes() -> list[list[str]]:
    """The command of each probe: a Python venv's, or Node's with a JS package."""
    given = os.environ.get("EVERVM_E2B_LEAK_PYTHONS", "")
    found = [[p, str(HERE / "leak_probe.py")] for p in given.split(os.pathsep) if p]
    if (JS_PACKAGES / "node_modules").is_dir():
        dependencies = json.loads((JS_PACKAGES / "package.json").read_text())["dependencies"]
        found += [["node", str(HERE / "leak_probe.mjs"), name] for name in dependencies]
    if len(found) < 2:
        reason = "no venvs of old E2B SDK releases (EVERVM_E2B_LEAK_PYTHONS) or js-leaks/"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: CI must test them")
        pytest.skip(reason)
    return found


def test_old_sdks_reach_only_evervm(e2b_server) -> None:
    listener = httpx.URL(e2b_server.e2b_url)
    sink = f"sdk-too-old@{listener.netloc.decode()}"
    env = dict(os.environ)
    env.update(
        E2B_API_URL=e2b_server.e2b_url,
        E2B_SANDBOX_URL=e2b_server.e2b_url,
        E2B_API_KEY=e2b_server.e2b_key,
        E2B_DOMAIN=sink,
    )
    env.pop("E2B_DEBUG", None)
    reached = 0
    for command in probes():
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        report = json.loads(done.stdout)
        outcome = report["outcome"]
        label = (
            f"{Path(command[0]).name} e2b {outcome.get('e2b')}, "
            f"code interpreter {outcome['e2b-code-interpreter']}"
        )
        print(label, outcome, file=sys.stderr)
        elsewhere = [entry for entry in report["seen"] if entry[1] != listener.host]
        assert not elsewhere, f"{label} reached {elsewhere}"
        reached += bool(report["seen"])
        if "create_error" in outcome and "E2B_SANDBOX_URL" in outcome["create_error"]:
            continue  # refused at create, naming the releases that work
        # Accepted, or failed before evervm could answer (a core that ignores E2B_API_URL
        # speaks TLS to the listener, or fetch refuses the sink domain's URL): the cell never
        # ran anywhere.
        assert "ran" not in outcome, f"{label} ran its cell: {outcome}"
    # The recording works: some probes did reach evervm, and were seen doing so.
    assert reached, "no probe was seen connecting to evervm: the recording proves nothing"
