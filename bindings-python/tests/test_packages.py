"""`Machine.install` from Python, against a package index of the test's own on loopback (the
engine in-process, process backend; the Rust end-to-end tests cover gVisor, C extensions, swap,
fork and restart)."""

import hashlib
import http.server
import io
import json
import threading
import zipfile
from pathlib import Path
from typing import Iterator

import pytest

import evervm


def _wheel(name: str, version: str, module: str, source: str) -> tuple[str, bytes]:
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"{module}.py", source)
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return f"{dist}-{version}-py3-none-any.whl", out.getvalue()


@pytest.fixture
def index(tmp_path: Path) -> Iterator[str]:
    root = tmp_path / "index"
    projects = {
        "evervm-py-hello": [_wheel("evervm-py-hello", "0.3", "evervm_py_hello", "WORD = 'hi'\n")],
        "evervm-py-source": [("evervm_py_source-1.0.tar.gz", b"source only")],
    }
    for project, files in projects.items():
        listed = []
        for filename, data in files:
            (root / "files").mkdir(parents=True, exist_ok=True)
            (root / "files" / filename).write_bytes(data)
            listed.append({
                "filename": filename,
                "url": f"../../files/{filename}",
                "hashes": {"sha256": hashlib.sha256(data).hexdigest()},
            })
        page = root / "simple" / project
        page.mkdir(parents=True)
        (page / "index.html").write_text(json.dumps({"meta": {"api-version": "1.1"}, "files": listed}))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args) -> None:  # type: ignore[no-untyped-def]
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple/"
    server.shutdown()


def test_install_makes_a_wheel_importable(index: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVERVM_PACKAGE_INDEX", index)
    client = evervm.Client.local(home=tmp_path / "home", backend="process", pool_size=0)
    try:
        machine = client.create_machine()
        report = machine.install(["evervm-py-hello==0.3"])
        assert [(p.name, p.version) for p in report.installed] == [("evervm-py-hello", "0.3")]
        assert len(report.installed[0].sha256) == 64
        assert "Successfully installed evervm-py-hello-0.3" in report.summary()
        assert machine.exec("import evervm_py_hello; evervm_py_hello.WORD").value == "'hi'"
        again = machine.install(["evervm-py-hello"])
        assert again.installed == [] and [p.name for p in again.satisfied] == ["evervm-py-hello"]
        with pytest.raises(evervm.InvalidInputError, match="no wheel"):
            machine.install(["evervm-py-source"])
        with pytest.raises(evervm.InvalidInputError, match="requirement"):
            machine.install(["not a requirement!"])
        pip = machine.exec("%pip install evervm-py-hello")
        assert pip.ok and "already satisfied" in pip.stdout
    finally:
        client.close()
