"""Runs E2B's own code-interpreter test suites (Python and JS, from e2b-dev/code-interpreter),
or with `--suite core` the E2B SDK's own Python tests of sandboxes, commands and files (from
e2b-dev/E2B), unchanged, against `evervm serve --e2b-listen` on gVisor, and sorts every failure
into the causes evervm accepts (other languages' kernels, E2B's hosted services) or
`UNEXPECTED`. Exits 1 when any failure is unexpected.

E2B's tests are never committed: fetch the repository and name its git directory (or a checkout):

    python3 tests/e2b/peer_suites.py --repo /work/.mirror/e2b-dev+code-interpreter/repo [--lang python|js]
    python3 tests/e2b/peer_suites.py --suite core --repo /work/.mirror/e2b-dev+E2B/repo

It needs the debug `evervm` (or EVERVM_BIN), runsc and the images (what `scripts/test.sh` sets
up), and installs the SDKs and test runners under ~/.cache/evervm/peer-* once. Not run by CI:
the suites are not ours to keep; the code interpreter's two take about 3 minutes here, and
the core one 3 more.
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
# The release of `packages/python-sdk` beside E2B's tests (its pyproject.toml), and the test
# runners of its uv.lock.
CORE_PINS = ["e2b==2.45.1", "pytest==9.1.1", "pytest-asyncio==1.4.0", "pytest-xdist==3.8.0",
             "pytest-timeout==2.4.0", "pytest-dotenv==0.5.2"]
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

# The core suite's directories under `packages/python-sdk/tests` that reach a server; those not
# run, and why. (Its top-level tests and `shared/` but `git/` are the SDK's unit tests.)
CORE_TESTS = ["sync/sandbox_sync", "async/sandbox_async", "sync/api_sync", "async/api_async",
              "shared/git", "sync/template_sync", "async/template_async"]
CORE_NOT_RUN = {
    "sync/volume_sync, async/volume_async": "E2B's volumes: the tests mock its service (an "
    "in-memory API), so they never reach evervm",
    "sync/secret_sync, async/secret_async": "E2B's secrets: the tests mock its service, so they "
    "never reach evervm",
}
CORE_EXCLUDED = [
    # (Not `Template.exists`: it asks for an alias, and `base` is one of evervm's.)
    (re.compile(r"template_(a)?sync/(?!test_exists\.py)"), "E2B's template builder"),
    # A sidecar sandbox of E2B's `httpbin` template (built by E2B's builder).
    (re.compile(r"test_network\.py::test_firewall_transform_injects_headers"),
     "E2B's template builder"),
    # A mocked connect whose sandbox URL must be E2B's own, which E2B_SANDBOX_URL overrides.
    (re.compile(r"test_config_propagation\.py::test_connect_sets_stable_host_routing_headers"),
     "E2B_SANDBOX_URL is set"),
    # Differences docs/e2b.md states (What differs from hosted E2B).
    # They write https:// before get_host: without --tls, evervm answers plain HTTP.
    (re.compile(r"test_host\.py::test_ping_server|test_create\.py::test_auto_resume_wakes_on_http"
                r"|test_network\.py::test_(allow_public_traffic|mask_request_host)"),
     "get_host over https: run with --tls"),
    # They curl 1.1.1.1, 8.8.8.8 and Google; the only networks here are loopback and the
    # namespaces a test makes (evervm's own network tests: tests/tests/e2e/network.rs).
    (re.compile(r"test_internet_access\.py::test_internet_access_(enabled|default)"
                r"|test_network\.py::test_(allow_specific_ip|allow_takes_precedence)"),
     "the public internet, which this host cannot reach"),
    (re.compile(r"test_network\.py::test_(deny_specific_ip|update_network)"),
     "documented: single denied blocks and update_network are refused by name"),
    (re.compile(r"test_create\.py::test_auto_pause_filesystem_only|test_snapshot_filesystem_only"),
     "documented: a filesystem-only pause (keep_memory=False) is refused by name"),
    (re.compile(r"test_sandbox_killed_during_run\.py"),
     "documented: e2b 2.45.1 reads a killed command's stream as a timeout"),
]


def cause(test_file: str, excluded: list[tuple[re.Pattern[str], str]] = EXCLUDED) -> str:
    for pattern, reason in excluded:
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


def python_env(name: str = "peer-python", pins: list[str] = PYTHON_PINS) -> Path:
    env = CACHE / name
    stamp = env / "pins.txt"
    if not stamp.exists() or stamp.read_text() != "\n".join(pins):
        shutil.rmtree(env, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        subprocess.run([str(env / "bin/pip"), "install", "-q", *pins], check=True)
        stamp.write_text("\n".join(pins))
    return env / "bin" / "python"


def run_python(suite: Path, env: dict[str, str], package: str = "e2b_code_interpreter",
               python: Path | None = None,
               args: tuple[str, ...] = ("tests",)) -> list[tuple[str, str, str]]:
    """(test id, outcome, first line of the failure) for every test of the Python suite."""
    # The released SDK (the pins) is under test, not the repository's newer source beside the
    # tests, which may need an unreleased `e2b`.
    shutil.rmtree(suite / package, ignore_errors=True)
    report = suite / "report.xml"
    subprocess.run([str(python or python_env()), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    f"--junitxml={report}", *args],
                   cwd=suite, env=env, check=False)
    import xml.etree.ElementTree as ET  # noqa: PLC0415

    results = []
    for case in ET.parse(report).iter("testcase"):
        # `tests.sync.test_x` or, for a test in a class, `tests.sync.test_x.TestY`.
        module, _, klass = case.get("classname", "").rpartition(".")
        if not klass[:1].isupper():
            module, klass = case.get("classname", ""), ""
        name = f"{module.replace('.', '/')}.py::{klass + '::' if klass else ''}{case.get('name')}"
        failure = case.find("failure")
        outcome = "failed" if failure is not None else "error"
        failure = failure if failure is not None else case.find("error")
        if failure is not None:
            # The first line, and the next when it ends in a colon (a command's stderr).
            lines = (failure.get("message") or "").strip().splitlines() or [""]
            message = " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]
            results.append((name, outcome, message[:200]))
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


def run_core(repo: Path, work: Path, env: dict[str, str]) -> list[tuple[str, str, str]]:
    """E2B's python-sdk tests of CORE_TESTS, two at a time (the machine's cores), E2B_DEBUG
    unset (it would send the tests to an envd on localhost and skip the API's)."""
    env = {key: value for key, value in env.items() if key != "E2B_DEBUG"}
    for dirs, reason in CORE_NOT_RUN.items():
        print(f"NOT RUN tests/{{{dirs}}}  [{reason}]")
    return run_python(export(repo, "packages/python-sdk", work), env, package="e2b",
                      python=python_env("peer-core", CORE_PINS),
                      args=("-n", "2", *(f"tests/{path}" for path in CORE_TESTS)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True,
                        help="e2b-dev/code-interpreter (or e2b-dev/E2B with --suite core): its "
                        "git directory or a checkout")
    parser.add_argument("--suite", choices=["code-interpreter", "core"],
                        default="code-interpreter")
    parser.add_argument("--lang", choices=["python", "js", "both"], default="both",
                        help="the code-interpreter suite's language")
    parser.add_argument("--tls", action="store_true",
                        help="serve over TLS (a certificate of a CA made here, which the SDKs "
                        "trust through SSL_CERT_FILE): E2B's tests write https:// URLs")
    args = parser.parse_args()
    if reason := evervm_serve.gvisor_reason():
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="evervm-peer-suite-"))
    tls_env: dict[str, str] = {}
    serve_args: list[str] = []
    if args.tls:
        tls_env["SSL_CERT_FILE"] = str(evervm_serve.make_test_ca(work))
        cert, key = evervm_serve.issue_test_certificate(work, "server")
        serve_args = ["--tls-cert", str(cert), "--tls-key", str(key)]
    # Ports public unless asked otherwise, as E2B's are (evervm's default is owner-only).
    serve_args.append("--e2b-public-ports")
    server = evervm_serve.Server("gvisor", "evervm-peer-", e2b=True, args=serve_args)
    address = server.e2b_url.split("://", 1)[1]
    env = {**os.environ, **tls_env, "E2B_API_URL": server.e2b_url,
           "E2B_SANDBOX_URL": server.e2b_url, "E2B_API_KEY": server.e2b_key,
           "E2B_DOMAIN": f"sdk-too-old@{address}"}
    results: list[tuple[str, str, str]] = []
    try:
        if args.suite == "core":
            results += run_core(args.repo, work, env)
        elif args.lang in ("python", "both"):
            results += run_python(export(args.repo, "python", work), env)
        if args.suite == "code-interpreter" and args.lang in ("js", "both"):
            results += run_js(export(args.repo, "js", work), env)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    unexpected = 0
    counts: dict[str, dict[str, int]] = {"": {}}
    for name, outcome, message in sorted(results):
        # The core suite's totals by its top directory (sync, async, shared) too.
        for group in {"", name.split("/")[1] if args.suite == "core" else ""}:
            counts.setdefault(group, {})[outcome] = counts.get(group, {}).get(outcome, 0) + 1
        if outcome != "passed" and outcome != "skipped":
            why = cause(name, CORE_EXCLUDED if args.suite == "core" else EXCLUDED)
            unexpected += why == "UNEXPECTED"
            print(f"{outcome.upper():7} {name}  [{why}]  {message}")
    for group, totals in sorted(counts.items(), reverse=True):
        line = ", ".join(f"{n} {k}" for k, n in sorted(totals.items()))
        print(f"{group}: {line}" if group else f"{line} ({unexpected} unexpected)")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
