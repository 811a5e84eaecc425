"""`Machine.install` from Python, against a package index of the test's own on loopback (the
engine in-process, process backend; the Rust end-to-end tests cover gVisor, C extensions, swap,
fork and restart)."""

import sys
from pathlib import Path
from typing import Iterator

import pytest

import evervm

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "support"))
import package_index  # noqa: E402


@pytest.fixture
def index(tmp_path: Path) -> Iterator[str]:
    served = package_index.Index(tmp_path / "index", {
        "evervm-py-hello": [package_index.wheel("evervm-py-hello", "0.3", "evervm_py_hello", "WORD = 'hi'\n")],
        "evervm-py-source": [("evervm_py_source-1.0.tar.gz", b"source only")],
    })
    yield served.url
    served.stop()


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
