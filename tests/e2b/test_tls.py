"""`evervm serve --tls-cert --tls-key`: every listener over TLS (the evervm API and the E2B
listener, ports through `get_host` included), a client that does not trust the certificate
refused, and the certificate read again on SIGHUP. The certificates are made here with openssl:
a CA of the test's own and a server certificate for 127.0.0.1."""

import http.client
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "support"))
import evervm_serve  # noqa: E402

SUPPORT = str(REPO / "tests" / "support")


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tls")
    evervm_serve.make_test_ca(directory)
    for name in ("first", "second"):
        evervm_serve.issue_test_certificate(directory, name)
    # What the server is given: copies, replaced by the reload test.
    (directory / "served.pem").write_bytes((directory / "first.pem").read_bytes())
    (directory / "served.key").write_bytes((directory / "first.key").read_bytes())
    return directory


@pytest.fixture(scope="module")
def tls_server(certificates: Path) -> Iterator[evervm_serve.Server]:
    reason = evervm_serve.gvisor_reason()
    if reason and os.environ.get("CI"):
        pytest.fail(f"the TLS tests must run in CI, but {reason}")
    if reason:
        pytest.skip(reason)
    server = evervm_serve.Server(
        "gvisor", "evervm-tls-", e2b=True,
        args=["--tls-cert", str(certificates / "served.pem"),
              "--tls-key", str(certificates / "served.key")])
    yield server
    server.stop()


def _trusting(certificates: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certificates / "ca.pem"))


def _served_common_name(url: str, certificates: Path) -> str:
    host, port = url.removeprefix("https://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as tcp:
        with _trusting(certificates).wrap_socket(tcp, server_hostname=host) as tls:
            subject = dict(field[0] for field in tls.getpeercert()["subject"])
            return subject["commonName"]


def test_every_listener_speaks_tls_to_a_client_that_trusts_it(tls_server, certificates) -> None:
    assert tls_server.url.startswith("https://")
    assert tls_server.e2b_url.startswith("https://")
    request = urllib.request.Request(f"{tls_server.url}/v1/machine/list",
                                     headers={"Authorization": f"Bearer {tls_server.token}"})
    # A client with only the system's roots refuses the certificate: nothing is sent.
    with pytest.raises(urllib.error.URLError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError), refused.value
    # Plain HTTP to the TLS port gets no answer of the API.
    with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
        urllib.request.urlopen(tls_server.url.replace("https://", "http://") + "/v1/machine/list",
                               timeout=30)
    with urllib.request.urlopen(request, timeout=30, context=_trusting(certificates)) as answer:
        assert answer.status == 200


# What an application does over https: its own process, started with the CA trusted
# (SSL_CERT_FILE is read when the SDK makes its HTTP client, once per process).
SDK_OVER_HTTPS = """
import ssl, sys
from e2b_code_interpreter import Sandbox

sys.path.insert(0, sys.argv[2])
from evervm_serve import get_until_served

trusting = ssl.create_default_context(cafile=sys.argv[1])
sandbox = Sandbox.create(timeout=120)
try:
    assert sandbox.run_code("x = 20; x * 2 + 2").text == "42"
    sandbox.commands.run("python3 -m http.server 8000 --directory /etc", background=True)
    # E2B's own tests write `https://` before get_host: so does this.
    url = f"https://{sandbox.get_host(8000)}/hostname"
    owner = {"e2b-traffic-access-token": sandbox.traffic_access_token}
    response = get_until_served(url, owner, verify=trusting, seconds=30)
    assert response.status_code == 200, response.text
    hostname = sandbox.commands.run("cat /etc/hostname").stdout.strip()
    assert response.text.strip() == hostname, (response.text, hostname)
finally:
    sandbox.kill()
print("served over https")
"""


def test_e2bs_sdk_and_its_ports_over_https(tls_server, certificates) -> None:
    ca = str(certificates / "ca.pem")
    env = {**os.environ, "SSL_CERT_FILE": ca, "E2B_API_URL": tls_server.e2b_url,
           "E2B_SANDBOX_URL": tls_server.e2b_url, "E2B_API_KEY": tls_server.e2b_key}
    run = subprocess.run([sys.executable, "-c", SDK_OVER_HTTPS, ca, SUPPORT], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "served over https"
    # Without the CA, the SDK refuses the server.
    env.pop("SSL_CERT_FILE")
    refused = subprocess.run([sys.executable, "-c", SDK_OVER_HTTPS, ca, SUPPORT], env=env,
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0
    assert "certificate" in refused.stderr.lower(), refused.stderr


def test_the_certificate_is_read_again_on_sighup(tls_server, certificates) -> None:
    assert _served_common_name(tls_server.url, certificates) == "first"
    (certificates / "served.pem").write_bytes((certificates / "second.pem").read_bytes())
    (certificates / "served.key").write_bytes((certificates / "second.key").read_bytes())
    os.kill(tls_server.process.pid, signal.SIGHUP)
    deadline = time.monotonic() + 30
    while _served_common_name(tls_server.url, certificates) != "second":
        assert time.monotonic() < deadline, "SIGHUP did not bring the new certificate"
        time.sleep(0.2)
    assert _served_common_name(tls_server.e2b_url, certificates) == "second"
    # Files that do not load leave the certificate in use, and the server up.
    (certificates / "served.key").write_text("not a key\n")
    os.kill(tls_server.process.pid, signal.SIGHUP)
    line = tls_server.wait_for_log("still serving the certificate loaded before")
    assert "served.key" in line, line
    assert tls_server.process.poll() is None
    assert _served_common_name(tls_server.url, certificates) == "second"
