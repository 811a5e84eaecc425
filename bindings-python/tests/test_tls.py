"""Clients of a server over https with a CA of its own (`evervm serve --tls-cert --tls-key`):
`Client(url, token, ca_file=...)`, `EVERVM_CA_FILE` and the CLI's `--ca-file` reach it (the
CLI's REPL over a WebSocket too); a client that trusts only the default roots refuses it before
sending anything. The certificates are made with openssl: a CA and a certificate for 127.0.0.1."""

import subprocess
from pathlib import Path
from typing import Iterator

import pytest

import evervm
from conftest import Server, evervm_serve


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tls")
    evervm_serve.make_test_ca(directory)
    evervm_serve.issue_test_certificate(directory, "server")
    return directory / "ca.pem"


@pytest.fixture(scope="module")
def tls_server(ca: Path) -> Iterator[Server]:
    server = Server("process", "evervm-pytls-",
                    args=["--tls-cert", str(ca.parent / "server.pem"),
                          "--tls-key", str(ca.parent / "server.key")])
    assert server.url.startswith("https://")
    yield server
    server.stop()


def _runs_code(client: evervm.Client) -> None:
    machine = client.create_machine(tags={"test": "tls"})
    try:
        assert machine.exec("6 * 7").value == "42"
    finally:
        machine.delete()


def test_a_client_given_the_ca_file_reaches_the_server(tls_server: Server, ca: Path) -> None:
    _runs_code(evervm.Client(tls_server.url, tls_server.token, ca_file=ca))


def test_evervm_ca_file_is_the_default(tls_server: Server, ca: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVERVM_CA_FILE", str(ca))
    _runs_code(evervm.Client(tls_server.url, tls_server.token))


async def test_the_async_client_takes_the_ca_file(tls_server: Server, ca: Path) -> None:
    client = evervm.AsyncClient(tls_server.url, tls_server.token, ca_file=str(ca))
    machine = await client.create_machine()
    try:
        assert (await machine.exec("2 ** 10")).value == "1024"
    finally:
        await machine.delete()


def test_without_the_ca_the_server_is_refused(tls_server: Server, ca: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EVERVM_CA_FILE", raising=False)
    with pytest.raises(evervm.EvervmError, match="(?i)certificate"):
        evervm.Client(tls_server.url, tls_server.token).list_machines()
    # A CA file that is not a CA: refused when the client is made, naming the file.
    with pytest.raises(evervm.EvervmError, match="server.key"):
        evervm.Client(tls_server.url, tls_server.token, ca_file=ca.parent / "server.key")


def test_the_cli_takes_ca_file(tls_server: Server, ca: Path) -> None:
    base = [str(evervm_serve.evervm_binary()), "--url", tls_server.url,
            "--token", tls_server.token]
    trusted = subprocess.run([*base, "--ca-file", str(ca), "machine", "list"],
                             capture_output=True, text=True, timeout=120)
    assert trusted.returncode == 0, trusted.stderr
    # The REPL talks over a WebSocket.
    repl = subprocess.run([*base, "--ca-file", str(ca), "repl"], input="6 * 7\n",
                          capture_output=True, text=True, timeout=120)
    assert repl.returncode == 0, repl.stderr
    assert "42" in repl.stdout, (repl.stdout, repl.stderr)
    refused = subprocess.run([*base, "machine", "list"], capture_output=True, text=True, timeout=120,
                             env={"PATH": "/usr/bin:/bin"})
    assert refused.returncode != 0
    assert "certificate" in refused.stderr.lower(), refused.stderr
