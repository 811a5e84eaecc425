"""`machine.files`: write, read, list, stat, mkdir, remove, upload and download, on both
transports (process backend), blocking and for asyncio."""

from pathlib import Path

import pytest

import evervm


def test_files_go_in_and_out(client: evervm.Client, tmp_path: Path) -> None:
    machine = client.create_machine()
    files = machine.files
    info = files.write("data/table.csv", "city,temp\nOslo,3\nRome,18\n", parents=True)
    assert (info.name, info.type, info.size, info.mode) == ("table.csv", "file", 25, 0o644)
    assert info.path.endswith("/data/table.csv") and info.modified_at
    assert files.read_text("data/table.csv") == "city,temp\nOslo,3\nRome,18\n"
    # The machine sees the file; what it writes comes back out.
    result = machine.exec(
        "import csv\nrows = list(csv.DictReader(open('data/table.csv')))\n"
        "open('data/out.txt', 'w').write(max(rows, key=lambda r: int(r['temp']))['city'])"
    )
    assert result.ok, result.error
    assert files.read("data/out.txt") == b"Rome"
    listing = files.list("data")
    assert [(e.name, e.type) for e in listing] == [("out.txt", "file"), ("table.csv", "file")]
    assert len(listing) == 2 and not listing.truncated and listing.directory.type == "directory"
    assert files.stat("~/data").type == "directory"
    assert files.exists("data/out.txt") and not files.exists("data/nothing")

    blob = bytes(range(256)) * 4096
    files.write("blob.bin", blob, mode=0o600)
    assert files.stat("blob.bin").mode == 0o600
    local = tmp_path / "blob.bin"
    files.download("blob.bin", local)
    assert local.read_bytes() == blob
    files.upload(local, "copy.bin")
    assert files.read("copy.bin") == blob

    files.mkdir("a/b/c", parents=True)
    with pytest.raises(evervm.ConflictError):
        files.remove("a")
    assert files.remove("a", recursive=True).type == "directory"
    assert not files.exists("a")
    machine.delete()


def test_file_errors_say_what_is_wrong(client: evervm.Client) -> None:
    machine = client.create_machine()
    files = machine.files
    machine.exec("import os; os.symlink('/etc', 'etc')")
    for path in ["../x", "/etc/passwd", "etc/passwd"]:
        with pytest.raises(evervm.PermissionDeniedError) as denied:
            files.read(path)
        assert "outside" in str(denied.value)
    with pytest.raises(evervm.NotFoundError):
        files.read("missing.txt")
    with pytest.raises(TypeError):
        files.write("x", 42)  # type: ignore[arg-type]
    with pytest.raises(evervm.InvalidInputError):
        files.write("x", b"", mode=0o10000)
    with pytest.raises(evervm.NotFoundError):
        client.machine("no-such-machine").files.exists("x")
    machine.delete()


async def test_async_files(tmp_path: Path) -> None:
    async with await evervm.AsyncClient.local(home=tmp_path / "a", backend="process", pool_size=0) as c:
        machine = await c.create_machine()
        files = machine.files
        await files.write("n.txt", "42")
        assert await files.read("n.txt") == b"42"
        assert await files.read_text("n.txt") == "42"
        assert [e.name for e in await files.list()] == ["n.txt"]
        assert (await files.stat("n.txt")).size == 2
        assert await files.exists("n.txt")
        await files.mkdir("d")
        await files.remove("d")
        local = tmp_path / "n.txt"
        await files.download("n.txt", local)
        await files.upload(local, "m.txt")
        assert await files.read("m.txt") == b"42"
        with pytest.raises(evervm.PermissionDeniedError):
            await files.read("/etc/passwd")
