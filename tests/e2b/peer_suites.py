"""Runs E2B's own code-interpreter test suites (Python and JS, from e2b-dev/code-interpreter),
unchanged, against `evervm serve --e2b-listen` on gVisor, and sorts every failure into the
causes a later issue owns (other languages' kernels) or `UNEXPECTED`.
Exits 1 when any failure is unexpected.

E2B's tests are never committed: fetch the repository and name its git directory (or a checkout):

    python3 tests/e2b/peer_suites.py --repo /work/.mirror/e2b-dev+code-interpreter/repo [--lang python|js]

It needs the debug `evervm` (or EVERVM_BIN), runsc and the images (what `scripts/test.sh` sets
up), and installs the SDKs and test runners under ~/.cache/evervm/peer-* once. Not run by CI:
the suites are not ours to keep, and the two take about 3 minutes here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "support"))
import evervm_serve  # noqa: E402

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "evervm"
PYTHON_PINS = ["e2b-code-interpreter==2.11.5", "e2b==2.63.0", "pytest==9.2.0",
               "pytest-asyncio==1.5.0", "pytest-xdist==3.8.0", "pytest-dotenv==0.5.2",
               "matplotlib==3.10.7"]
JS_PINS = ["e2b@2.51.0", "vitest@4.1.0", "dotenv@16.4.5", "typescript@5.5.3"]

# Test files whose tests belong to "The E2B door is a whole E2B sandbox" (another issue), by the
# cause; a failure anywhere else is unexpected. Paths are relative to the suite's `tests/`.
EXCLUDED = [
    (re.compile(r"env_vars/test_(bash|java|js|r)\.py|env_vars/(bash|java|js|r)\.test\.ts"),
     "another language's kernel"),
    (re.compile(r"test_(async_)?default_kernels\.py|defaultKernels\.test\.ts"),
     "another language's kernel"),
    # E2B's sandboxes start a JavaScript context beside the Python one; evervm runs Python only.
    (re.compile(r"(test_(async_)?contexts\.py|contexts\.test\.ts)::.*list[_ ]contexts"),
     "another language's kernel"),
    # The working directory's tests in other languages (the Python ones must pass: /home/user).
    (re.compile(r"(test_(async_)?cwd\.py|cwd\.test\.ts)::.*[_ :](bash|java|javascript|js|r|ts|"
                r"typescript|deno)\b", re.IGNORECASE),
     "another language's kernel"),
]


def cause(test_file: str) -> str:
    for pattern, reason in EXCLUDED:
        if pattern.search(test_file):
            return reason
    return "UNEXPECTED"


def export(repo: Path, subdir: str, into: Path) -> Path:
    """The suite's `subdir` from a git directory (HEAD) or a checkout, copied under `into`."""
    if (repo / subdir).is_dir():
        shutil.copytree(repo / subdir, into / subdir)
    else:
        archive = subprocess.run(["git", "--git-dir", str(repo), "archive", "HEAD", subdir],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / subdir


def python_env() -> Path:
    env = CACHE / "peer-python"
    stamp = env / "pins.txt"
    if not stamp.exists() or stamp.read_text() != "\n".join(PYTHON_PINS):
        shutil.rmtree(env, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        subprocess.run([str(env / "bin/pip"), "install", "-q", *PYTHON_PINS], check=True)
        stamp.write_text("\n".join(PYTHON_PINS))
    return env / "bin" / "python"


def run_python(suite: Path, env: dict[str, str]) -> list[tuple[str, str, str]]:
    """(test id, outcome, first line of the failure) for every test of the Python suite."""
    # The released SDK (PYTHON_PINS) is under test, not the repository's newer source beside
    # the tests, which may need an unreleased `e2b`.
    shutil.rmtree(suite / "e2b_code_interpreter", ignore_errors=True)
    report = suite / "report.xml"
    subprocess.run([str(python_env()), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    f"--junitxml={report}", "tests"],
                   cwd=suite, env=env, check=False)
    import xml.etree.ElementTree as ET  # noqa: PLC0415

    results = []
    for case in ET.parse(report).iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        failure = case.find("failure")
        failure = failure if failure is not None else case.find("error")
        if failure is not None:
            results.append((name, "failed", (failure.get("message") or "").splitlines()[0][:160]
                            if failure.get("message") else ""))
        elif case.find("skipped") is not None:
            results.append((name, "skipped", ""))
        else:
            results.append((name, "passed", ""))
    return results


def run_js(suite: Path, env: dict[str, str]) -> list[tuple[str, str, str]]:
    """The same for the JS suite (vitest), its dependencies from npm, cached."""
    modules = CACHE / "peer-js" / "node_modules"
    if not modules.exists():
        (CACHE / "peer-js").mkdir(parents=True, exist_ok=True)
        (CACHE / "peer-js" / "package.json").write_text('{"private": true}\n')
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", *JS_PINS],
                       cwd=CACHE / "peer-js", check=True)
    (suite / "node_modules").symlink_to(modules)
    report = suite / "report.json"
    subprocess.run([str(modules / ".bin" / "vitest"), "run", "--reporter=json",
                    f"--outputFile={report}", "--exclude", "tests/runtimes/**"],
                   cwd=suite, env=env, check=False)
    results = []
    for file in json.loads(report.read_text())["testResults"]:
        path = os.path.relpath(file["name"], suite)
        for test in file["assertionResults"]:
            message = (test.get("failureMessages") or [""])[0].splitlines()
            outcome = {"passed": "passed", "failed": "failed"}.get(test["status"], "skipped")
            results.append((f"{path}::{test['fullName']}", outcome,
                            message[0][:160] if message else ""))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True,
                        help="e2b-dev/code-interpreter: its git directory or a checkout")
    parser.add_argument("--lang", choices=["python", "js", "both"], default="both")
    args = parser.parse_args()
    if reason := evervm_serve.gvisor_reason():
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    server = evervm_serve.Server("gvisor", "evervm-peer-", e2b=True)
    work = Path(tempfile.mkdtemp(prefix="evervm-peer-suite-"))
    env = {**os.environ, "E2B_API_URL": server.e2b_url, "E2B_SANDBOX_URL": server.e2b_url,
           "E2B_API_KEY": server.e2b_key, "E2B_DOMAIN": f"sdk-too-old@{server.e2b_url[7:]}"}
    results: list[tuple[str, str, str]] = []
    try:
        if args.lang in ("python", "both"):
            results += run_python(export(args.repo, "python", work), env)
        if args.lang in ("js", "both"):
            results += run_js(export(args.repo, "js", work), env)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    unexpected = 0
    counts: dict[str, int] = {}
    for name, outcome, message in sorted(results):
        counts[outcome] = counts.get(outcome, 0) + 1
        if outcome == "failed":
            why = cause(name)
            unexpected += why == "UNEXPECTED"
            print(f"FAILED  {name}  [{why}]  {message}")
    print(", ".join(f"{n} {k}" for k, n in sorted(counts.items())),
          f"({unexpected} unexpected)")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
