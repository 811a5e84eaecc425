#!/usr/bin/env python3
"""Fuzzes evervm's HTTP API with schemathesis, against the server's own /openapi.json.

Starts `evervm serve --backend process` on a free loopback port with a fresh home, runs
schemathesis with the token the server printed at its first start (settings in
schemathesis.toml, hooks in hooks.py), stops the server (SIGINT, a graceful stop), and fails when
schemathesis found anything or the server logged an error. See README.md beside this file.

    python tests/api/run.py --mode ci      # bounded, as scripts/test.sh runs it
    python tests/api/run.py --mode full    # many more examples, for figures

Run it with the Python that has schemathesis installed (its `schemathesis` command is taken from
beside that interpreter). The server binary is EVERVM_BIN, else target/debug/evervm.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))
import evervm_serve  # noqa: E402

# Examples per operation, per mode. (schemathesis's --max-time is no bound: with it, fuzzing
# repeats until the time is spent.) `ci` has a fixed seed, so that CI fails on a change of the
# server or the document, not on the draw, and stops schemathesis after `limit` seconds (a hang
# fails this run rather than CI's); `full` draws anew each time (its seed is printed, for --seed).
MODES = {
    "ci": {"max_examples": 100, "seed": 1, "limit": 600},
    "full": {"max_examples": 500, "seed": None, "limit": None},
}
PHASES = "examples,coverage,fuzzing,stateful"

# Every response check that holds for this API (`schemathesis run --help` lists them). Left out:
# `object_level_authorization`, which needs two accounts' tokens.
CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "response_headers_conformance",
        "negative_data_rejection",
        "positive_data_acceptance",
        "missing_required_header",
        "unsupported_method",
        "allow_header_conformance",
        "use_after_free",
        "ensure_resource_availability",
        "ignored_auth",
        # hooks.py: stream-result's NDJSON lines.
        "stream_result_lines",
    ]
)


class Server:
    """`evervm serve --backend process` on a free loopback port and a fresh home."""

    def __init__(self, home: Path) -> None:
        self.log_path = home / "server.log"
        self.log = open(self.log_path, "w")
        try:
            self.process, self.url, self.token = evervm_serve.start_serve(
                "process", home / "home", stderr=self.log, env={"EVERVM_LOG": "warn"})
        except FileNotFoundError as e:
            sys.exit(str(e))
        except RuntimeError as e:
            self.log.close()
            sys.exit(f"{e}; its log:\n{self.log_path.read_text()}")

    def stop(self) -> int | None:
        """Stops the server gracefully (its Ctrl-C); its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        return self.process.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="ci")
    parser.add_argument("--max-examples", type=int, help="examples per operation (mode's default)")
    parser.add_argument("--seed", type=int, help="for a reproducible run")
    parser.add_argument(
        "--report-dir", type=Path, help="keep schemathesis's JUnit report and HAR log here"
    )
    args = parser.parse_args()
    mode = MODES[args.mode]
    schemathesis = Path(sys.executable).parent / "schemathesis"
    if not schemathesis.exists():
        sys.exit(f"no {schemathesis}: `pip install schemathesis` into this Python's environment")

    work = Path(tempfile.mkdtemp(prefix="evervm-api-"))
    server = Server(work)
    command = [
        str(schemathesis),
        "--no-color",
        "--config-file",
        str(HERE / "schemathesis.toml"),
        "run",
        f"{server.url}/openapi.json",
        "--header",
        f"Authorization: Bearer {server.token}",
        "--checks",
        CHECKS,
        "--phases",
        PHASES,
        "--max-examples",
        str(args.max_examples or mode["max_examples"]),
        # One worker: hypothesis parses lambdas with `ast`, which is not thread-safe on Python
        # 3.11 ("AST constructor recursion depth mismatch").
        "--workers",
        "1",
        "--generation-database",
        "none",
        "--suppress-health-check",
        "too_slow,filter_too_much",
    ]
    seed = args.seed if args.seed is not None else mode["seed"]
    if seed is not None:
        command += ["--seed", str(seed)]
    if args.report_dir:
        command += ["--report", "junit,har", "--report-dir", str(args.report_dir.resolve())]
    print("$", " ".join(command).replace(server.token, "<token>"), flush=True)
    started = time.monotonic()
    summary = None
    try:
        # Echoed as it comes, and its closing "Test cases:" line kept for the summary below.
        # In the temporary directory, where schemathesis and hypothesis keep their caches.
        env = {**os.environ, "SCHEMATHESIS_HOOKS": str(HERE / "hooks.py")}
        with subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE, text=True) as run:
            timer = threading.Timer(mode["limit"] or 0, run.kill)
            if mode["limit"]:
                timer.start()
            assert run.stdout is not None
            for line in run.stdout:
                print(line, end="", flush=True)
                if re.match(r"\s*\d+ generated", line):
                    summary = line
        timer.cancel()
        status = run.returncode
        if status < 0:
            print(f"schemathesis did not finish within {mode['limit']} s: stopped")
            status = 1
    finally:
        stopped = server.stop()
    print(f"schemathesis took {time.monotonic() - started:.0f} s; the server exited with {stopped}")
    errors = [line for line in server.log_path.read_text().splitlines() if " ERROR " in line]
    if errors:
        print(f"the server logged {len(errors)} errors, the first ones:", *errors[:20], sep="\n")
        status = status or 1
    if stopped != 0:
        print(f"the server did not stop cleanly; its log is in {server.log_path}")
        status = status or 1
    else:
        shutil.rmtree(work, ignore_errors=True)
    print(closing_line(summary, status))
    return status


def closing_line(summary: str | None, status: int) -> str:
    """The run in one line, "api: N passed, N failed": test cases that passed, and unique
    failures plus errors (1 when the run failed otherwise)."""
    def count(pattern: str) -> int:
        found = re.search(pattern, summary or "")
        return int(found.group(1)) if found else 0

    generated, errored = count(r"(\d+) generated"), count(r"(\d+) errored")
    failed = count(r"(\d+) unique failures?") + errored
    passed = count(r"(\d+) passed") or max(generated - count(r"(\d+) found") - errored, 0)
    if status != 0 and failed == 0:
        failed = 1
    return f"api: {passed} passed, {failed} failed"


if __name__ == "__main__":
    sys.exit(main())
