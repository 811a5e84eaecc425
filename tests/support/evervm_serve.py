"""`evervm serve` for the Python test suites (the Python package's, the API fuzzing, the MCP
server's): the binary, and a server on a free loopback port that has said its URL and token."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[2]


def evervm_binary() -> Path:
    """The `evervm` command: EVERVM_BIN, else the workspace's debug build (under
    CARGO_TARGET_DIR when set). Raises FileNotFoundError saying how to get it."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    path = Path(os.environ.get("EVERVM_BIN", target / "debug" / "evervm"))
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: run `cargo build -p evervm-cli` or set EVERVM_BIN")
    return path


def gvisor_reason() -> str | None:
    """Why gVisor cannot run tests here, or None when it can."""
    if os.geteuid() != 0:
        return "gVisor sandboxes need root"
    if not (shutil.which("runsc") or Path("/usr/bin/runsc").exists()
            or (Path.home() / ".cache/evervm/runsc").exists()):
        return "runsc is not installed (scripts/setup.sh installs it)"
    return None


def start_serve(backend: str, home: Path | str, stderr: int | IO[str] = subprocess.DEVNULL,
                env: dict[str, str] | None = None, e2b: bool = False,
                args: list[str] | None = None) -> tuple[subprocess.Popen[str], str, str]:
    """Starts `evervm serve` on `home` (new: the server prints a token at its first start);
    the process, its URL (no trailing slash) and the token. With `e2b`, the server also serves
    E2B's API (`--e2b-listen`): read its URL and key with `e2b_from_banner`. Raises RuntimeError
    when the server says neither (the process is then stopped)."""
    command = [str(evervm_binary()), "serve", "--listen", "127.0.0.1:0", "--backend", backend,
               "--home", str(home), *(args or [])]
    if e2b:
        command += ["--e2b-listen", "127.0.0.1:0"]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=stderr, text=True,
        env={**os.environ, "EVERVM_POOL_SIZE": "1", **(env or {})},
    )
    url = token = None
    assert process.stdout is not None
    banner = []
    for line in process.stdout:
        banner.append(line)
        if m := re.search(r"listening on (\S+)", line):
            url = m.group(1)
        if m := re.search(r"export EVERVM_TOKEN=(\S+)", line):
            token = m.group(1)
        if url and token and (not e2b or "E2B-compatible API on" in line):
            process.banner = "".join(banner)  # type: ignore[attr-defined]
            return process, url.rstrip("/"), token
    process.kill()
    process.wait()
    raise RuntimeError("the server printed no URL and token")


def e2b_from_banner(banner: str) -> tuple[str, str]:
    """The E2B API's URL and the first token's E2B key, from the banner of a server started with
    `e2b=True`."""
    url = re.search(r"E2B-compatible API on (\S+?):? ", banner)
    key = re.search(r"E2B_API_KEY=(e2b_[0-9a-f]+)", banner)
    if not (url and key):
        raise RuntimeError(f"the banner names no E2B URL and key:\n{banner}")
    return url.group(1).rstrip(":"), key.group(1)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_test_ca(directory: Path) -> Path:
    """A CA of a test's own (`ca.pem`, `ca.key` in `directory`), for two days: its certificate."""
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", str(directory / "ca.key"), "-out", str(directory / "ca.pem"),
             "-days", "2", "-subj", "/CN=evervm test CA")
    return directory / "ca.pem"


def issue_test_certificate(directory: Path, name: str) -> tuple[Path, Path]:
    """A server certificate for 127.0.0.1 with the common name `name`, signed by the CA that
    `make_test_ca` made in `directory`: its certificate and key files (`name.pem`, `name.key`)."""
    key, request, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
    extensions = directory / f"{name}.ext"
    extensions.write_text("subjectAltName = IP:127.0.0.1\n")
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", str(key), "-out", str(request), "-subj", f"/CN={name}")
    _openssl("x509", "-req", "-in", str(request), "-CA", str(directory / "ca.pem"),
             "-CAkey", str(directory / "ca.key"), "-CAcreateserial", "-days", "2",
             "-extfile", str(extensions), "-out", str(cert))
    return cert, key


def get_until_served(url: str, headers: dict, verify=True, seconds: float = 20):
    """GET `url` until it answers 200 or `seconds` pass (E2B's own tests' loop: a server started
    in a sandbox in the background answers after a moment); the last answer (an httpx
    Response). `verify` is httpx's: True, or an SSLContext that trusts a test's CA."""
    import httpx

    deadline = time.monotonic() + seconds
    while True:
        response = httpx.get(url, headers=headers, timeout=30, verify=verify)
        if response.status_code == 200 or time.monotonic() > deadline:
            return response
        time.sleep(0.5)


class Server:
    """`evervm serve` on `backend`, a free loopback port and a fresh home (`prefix` names it),
    stopped (and its home removed) by `stop`."""

    def __init__(self, backend: str, prefix: str = "evervm-", env: dict[str, str] | None = None,
                 e2b: bool = False, args: list[str] | None = None) -> None:
        self.home = tempfile.mkdtemp(prefix=prefix)
        # The server's log, beside its home (not in it: the server owns that).
        self.log_path = Path(f"{self.home}.log")
        self._log = self.log_path.open("w")
        self.process, self.url, self.token = start_serve(backend, self.home, stderr=self._log,
                                                         env=env, e2b=e2b, args=args)
        if e2b:
            self.e2b_url, self.e2b_key = e2b_from_banner(self.process.banner)  # type: ignore[attr-defined]

    def wait_for_log(self, text: str, timeout: float = 30) -> str:
        """The first line of the server's log that contains `text`, waiting up to `timeout`
        seconds for it; AssertionError naming `text` when it does not come."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.log_path.read_text(errors="replace").splitlines():
                if text in line:
                    return line
            assert time.monotonic() < deadline, f"the server did not log {text!r}"
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)
        self._log.close()
        shutil.rmtree(self.home, ignore_errors=True)
        self.log_path.unlink(missing_ok=True)
