"""A package index for the Python-driven tests: PEP 691 pages and wheel files served over HTTP on
loopback, and wheels made on the spot (the Rust tests have the same in tests/src)."""

import hashlib
import http.server
import io
import json
import threading
import zipfile
from pathlib import Path


def wheel(name: str, version: str, module: str, source: str) -> tuple[str, bytes]:
    """A pure-Python wheel holding `module`.py with `source`."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"{module}.py", source)
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return f"{dist}-{version}-py3-none-any.whl", out.getvalue()


class Index:
    """Serves `projects` (name -> [(file name, bytes)]) from `root` until `stop`."""

    def __init__(self, root: Path, projects: dict[str, list[tuple[str, bytes]]]) -> None:
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

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/simple/"

    def stop(self) -> None:
        self._server.shutdown()
