"""Jupyter cells on evervm, compared with a real IPython kernel, field by field.

Each case of jupyter_cases.py runs on Debian's ipykernel (the IPython the `data` image has, on
the same Python, with the same pinned wheels: engine/src/guest/image/data-wheels.txt), driven by
jupyter_client with E2B's kernel settings, and on evervm: through E2B's `/execute` (the SDK's
`run_code`) and through evervm's own API (`dialect: jupyter`).

E2B_CHANGES are what E2B's code interpreter does on top of the kernel; they are applied to the
kernel's side before comparing with E2B's door. A case's `known` fields are left out, each with
its reason. Everything else must match: printed text, exactly; each result's fields; the error's
name, value and traceback.

Needs a Python with Debian's ipykernel and the data image's wheels, EVERVM_REFERENCE_PYTHON
(scripts/test.sh makes one: a venv of /usr/bin/python3 with its system packages, and
`pip install --require-hashes -r engine/src/guest/image/data-wheels.txt`), and jupyter_client in
this Python; skipped without them, except in CI."""

import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from jupyter_cases import CASES, Case  # noqa: E402

REFERENCE_PYTHON = os.environ.get("EVERVM_REFERENCE_PYTHON", "/usr/bin/python3")

# E2B's kernel settings (its template's ipython_kernel_config.py), on the kernel's command line.
KERNEL_SETTINGS = ["--InteractiveShell.colors=NoColor", "--PlainTextFormatter.max_seq_length=0"]

# What E2B's code interpreter adds on top of the kernel (its template's startup formatters),
# run once in the reference kernel, unstored: a DataFrame's columns as `e2b/data` (timestamps
# as ISO 8601), a matplotlib figure as `e2b/chart` (e2b_charts' reading of it), lists and dicts
# as JSON, and PIL images displayed when shown or saved to a path.
E2B_CHANGES = r"""
import json as _json, sys as _sys
from IPython.core.formatters import BaseFormatter as _Base
from traitlets import ObjectName as _Name, Unicode as _Unicode

def _e2b_value(v):
    if hasattr(v, "isoformat"):
        return v.isoformat()
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and v != v:
        return None
    return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)

class _Data(_Base):
    format_type = _Unicode("e2b/data")
    print_method = _Name("_repr_e2b_data_")
    def __call__(self, obj):
        pd = _sys.modules.get("pandas")
        if pd is not None and isinstance(obj, pd.DataFrame):
            return {str(k): [_e2b_value(v) for v in vs] for k, vs in obj.to_dict(orient="list").items()}
        return super().__call__(obj)

class _Chart(_Base):
    format_type = _Unicode("e2b/chart")
    print_method = _Name("_repr_e2b_chart_")
    def __call__(self, obj):
        if _sys.modules.get("matplotlib") is None:
            return super().__call__(obj)
        from matplotlib.figure import Figure
        if not isinstance(obj, Figure):
            return super().__call__(obj)
        from e2b_charts import chart_figure_to_dict
        try:
            return chart_figure_to_dict(obj)
        except Exception:
            return {}

import PIL.Image as _Image
from PIL.ImageShow import UnixViewer as _Viewer
_Viewer.show_file = lambda self, path, **options: 0
_save = _Image.Image.save
def _saved(image, fp, format=None, **options):
    if isinstance(fp, str):
        display(image)
    _save(image, fp, format, **options)
_Image.Image.save = _saved

_f = get_ipython().display_formatter
_f.formatters["e2b/data"] = _Data(parent=_f)
_f.formatters["e2b/chart"] = _Chart(parent=_f)
_json_formatter = _f.formatters["application/json"]
_json_formatter.for_type(list, lambda o: _json.loads(_json.dumps(o, default=_e2b_value)))
_json_formatter.for_type(dict, lambda o: _json.loads(_json.dumps(o, default=_e2b_value)))
del _f, _Data, _Chart, _json_formatter
"""

# E2B's names for MIME types (anything else goes to `extra`).
E2B_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}
BINARY = {"png", "jpeg", "pdf"}


def reference_available() -> str | None:
    try:
        import jupyter_client  # noqa: F401
    except ImportError:
        return "jupyter_client is not installed in this Python"
    wheels = Path(__file__).parents[2] / "engine/src/guest/image/data-wheels.txt"
    pins = [line.split(" ")[0] for line in wheels.read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    check = ("import importlib.metadata as m, sys, ipykernel\n"
             "wrong = [p for p in sys.argv[1:] if m.version(p.split('==')[0]) != p.split('==')[1]]\n"
             "sys.exit(', '.join(wrong) or None)")
    found = subprocess.run([REFERENCE_PYTHON, "-c", check, *pins], capture_output=True, text=True)
    if found.returncode != 0:
        return (f"{REFERENCE_PYTHON} lacks ipykernel or the data image's wheels "
                f"({(found.stderr.strip().splitlines() or ['?'])[-1]}): set "
                "EVERVM_REFERENCE_PYTHON as scripts/test.sh does")
    return None


class Kernel:
    """Debian's ipykernel under the reference Python, with E2B's settings, in its own
    directory."""

    def __init__(self, e2b: bool) -> None:
        from jupyter_client import KernelManager

        self.dir = tempfile.mkdtemp(prefix="evervm-kernel-")
        spec = Path(self.dir, "kernels", "reference")
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [REFERENCE_PYTHON, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                     *KERNEL_SETTINGS],
            "display_name": "reference",
            "language": "python",
        }))
        os.environ["JUPYTER_PATH"] = self.dir
        self.manager = KernelManager(kernel_name="reference")
        self.manager.start_kernel(cwd=self.dir)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)
        if e2b:
            self.run(E2B_CHANGES, store_history=False)

    def run(self, code: str, store_history: bool = True) -> dict[str, Any]:
        """A cell's messages as E2B's server would make its answer of them."""
        # Not stop_on_error: ipykernel would then abort the next cell, sent right after.
        msg_id = self.client.execute(code, store_history=store_history, stop_on_error=False)
        out: dict[str, Any] = {"stdout": [], "stderr": [], "results": [], "error": None}
        while True:
            msg = self.client.get_iopub_msg(timeout=120)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out[content["name"]].append(content["text"])
            elif kind in ("execute_result", "display_data"):
                out["results"].append((kind == "execute_result", content["data"]))
            elif kind == "error":
                out["error"] = (content["ename"], content["evalue"], "".join(content["traceback"]))
            elif kind == "status" and content["execution_state"] == "idle":
                break
        self.client.get_shell_msg(timeout=120)
        return out

    def stop(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def e2b_result(main: bool, data: dict[str, Any]) -> dict[str, Any]:
    """A kernel result as E2B's server makes it (E2B's change: `text` loses one quote at each
    end), reduced to what the comparison reads."""
    result: dict[str, Any] = {"main": main, "extra": []}
    for mime, value in data.items():
        field = E2B_FIELDS.get(mime)
        if field is None:
            result["extra"].append(mime)
        elif field == "chart" and not value:
            continue  # E2B's SDK reads an empty chart (a figure e2b_charts cannot read) as none
        elif field in BINARY:
            result[field] = True
        else:
            result[field] = value
    text = result.get("text")
    if isinstance(text, str) and len(text) >= 1 and text[0] == text[-1] and text[0] in "'\"":
        result["text"] = text[1:-1]
    result["extra"].sort()
    return result


def from_kernel(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "stdout": "".join(run["stdout"]),
        "stderr": "".join(run["stderr"]),
        "results": [e2b_result(main, data) for main, data in run["results"]],
        "error": run["error"],
    }


def from_e2b(execution: Any) -> dict[str, Any]:
    results = []
    for r in execution.results:
        result: dict[str, Any] = {"main": r.is_main_result, "extra": sorted((r.extra or {}).keys())}
        for field in E2B_FIELDS.values():
            value = getattr(r, field, None)
            if value is not None and not (field == "chart" and not value):
                result[field] = True if field in BINARY else value
        if "chart" in result:
            result["chart"] = r.chart.to_dict()
        results.append(result)
    error = execution.error
    return {
        "stdout": "".join(execution.logs.stdout),
        "stderr": "".join(execution.logs.stderr),
        "results": results,
        "error": None if error is None else (error.name, error.value, error.traceback),
    }


def compare(case: Case, cell: int, kernel: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    known = dict(case.known)
    differences = []
    for field in ("stdout", "stderr", "results", "error"):
        if field in known or kernel[field] == ours[field]:
            continue
        differences.append(
            f"{case.id} cell {cell} {field}:\n  kernel: {kernel[field]!r}\n  evervm: {ours[field]!r}"
        )
    return differences


def reference_or_skip() -> None:
    reason = reference_available()
    if reason and os.environ.get("CI"):
        pytest.fail(f"the Jupyter differential tests must run in CI, but {reason}")
    if reason:
        pytest.skip(reason)


def test_e2b_execute_matches_the_kernel(e2b_server) -> None:
    reference_or_skip()
    from e2b_code_interpreter import Sandbox

    kernel = Kernel(e2b=True)
    sandbox = Sandbox.create(timeout=600)
    differences: list[str] = []
    try:
        for case in CASES:
            for index, code in enumerate(case.cells):
                expected = from_kernel(kernel.run(code))
                got = from_e2b(sandbox.run_code(code, timeout=120))
                differences += compare(case, index, expected, got)
    finally:
        sandbox.kill()
        kernel.stop()
    assert not differences, f"{len(differences)} differences:\n" + "\n".join(differences)


def api_result(main: bool, data: dict[str, Any]) -> dict[str, Any]:
    """A kernel result as evervm's own API gives it: the MIME bundle, binary types reduced to
    their presence."""
    return {
        "main": main,
        "data": {m: (True if m.startswith("image/") and m != "image/svg+xml" else v)
                 for m, v in data.items()},
    }


def lines_of(text: str) -> list[str]:
    """Text as evervm's API sends it: a chunk per line, split at "\n" only, without it."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def test_evervm_api_matches_the_kernel(e2b_server) -> None:
    reference_or_skip()
    kernel = Kernel(e2b=False)
    headers = {"Authorization": f"Bearer {e2b_server.token}"}
    http = httpx.Client(base_url=e2b_server.url, headers=headers, timeout=180)
    name = http.post("/v1/machine/new", json={"tags": {"suite": uuid.uuid4().hex}}).json()[
        "machine_name"
    ]
    differences: list[str] = []
    try:
        for case in CASES:
            for index, code in enumerate(case.cells):
                expected = kernel.run(code)
                seq = http.post(
                    f"/v1/machine/{name}/exec",
                    json={"instruction": {"code": code, "timeout_seconds": 120,
                                          "dialect": "jupyter"}},
                ).json()["instruction_seq"]
                lines = http.get(f"/v1/machine/{name}/exec/{seq}/stream-result",
                                 params={"rich": "true"}).text.splitlines()
                messages = [json.loads(line) for line in lines if line]
                stdout = [m["chunk"]["data"] for m in messages
                          if m["type"] == "output" and m["chunk"]["stream"] == "stdout"]
                result = next(m["result"] for m in messages if m["type"] == "result")
                shown = [api_result(r["kind"] == "value", r["data"]) for r in result.get("results", [])]
                exception = result.get("exception")
                values = [data.get("text/plain") for main, data in expected["results"] if main]
                kernel_side = {
                    "stdout": lines_of("".join(expected["stdout"])),
                    "value": values[0] if values else None,
                    "results": [api_result(main, data) for main, data in expected["results"]
                                if not main or len(data) > 1],
                    "error": expected["error"] and expected["error"][:2],
                }
                ours = {
                    "stdout": stdout,
                    "value": result.get("value"),
                    "results": shown,
                    "error": exception and (exception["name"], exception["value"]),
                }
                for field in kernel_side:
                    if field in dict(case.known) or kernel_side[field] == ours[field]:
                        continue
                    differences.append(f"{case.id} cell {index} {field}:\n  kernel: "
                                       f"{kernel_side[field]!r}\n  evervm: {ours[field]!r}")
    finally:
        http.delete(f"/v1/machine/{name}")
        kernel.stop()
    assert not differences, f"{len(differences)} differences:\n" + "\n".join(differences)
