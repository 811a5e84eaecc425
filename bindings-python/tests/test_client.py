"""The Client/Machine API in both transports, its errors, streams, async twins, fork safety."""

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import evervm


def test_state_values_output_and_errors(client: evervm.Client) -> None:
    machine = client.create_machine(tags={"suite": "python"})
    assert machine.exec("x = 20").value is None
    result = machine.exec("import sys\nprint('hi'); print('oops', file=sys.stderr)\nx + 1")
    assert (result.value, result.stdout, result.stderr, result.ok) == ("21", "hi\n", "oops\n", True)
    assert result.error is None and result.runtime_ms >= 0 and result.seq == 1
    assert [c.stream for c in result.output] == ["stdout", "stderr"]
    failed = machine.exec("1 / 0")
    assert not failed.ok and failed.cause == "exception" and "ZeroDivisionError" in (failed.error or "")
    assert failed.exception is not None
    assert (failed.exception.name, failed.exception.module, failed.exception.value) == (
        "ZeroDivisionError",
        "builtins",
        "division by zero",
    )
    cell = machine.exec("\n    y = x + 1\n    y", dialect="jupyter")
    assert (cell.value, cell.ok) == ("21", True), "an indented Jupyter cell runs"
    with pytest.raises(evervm.InvalidInputError):
        machine.exec("1", dialect="basic")
    slow = machine.exec("import time\ntime.sleep(5)", timeout=1)
    assert slow.timed_out and slow.cause == "timeout"
    assert machine.exec("x").value == "20"
    info = machine.info()
    assert info.name == machine.name and info.tags == {"suite": "python"}
    assert info.instruction_count == 6
    names = [m.name for m in client.list_machines(tags={"suite": "python"})]
    assert machine.name in names
    assert client.list_machines(tags={"suite": "nothing-like-this"}) == []
    machine.delete()
    with pytest.raises(evervm.NotFoundError):
        machine.info()


def test_stream_yields_output_then_the_result(client: evervm.Client) -> None:
    machine = client.create_machine()
    events = list(machine.stream("for i in range(3):\n    print(i)\n'done'"))
    assert [e.data for e in events[:-1] if isinstance(e, evervm.OutputChunk)] == ["0", "1", "2"]
    last = events[-1]
    assert isinstance(last, evervm.ExecResult) and last.value == "'done'"
    assert last.stdout == "0\n1\n2\n"


def test_rich_results_stream_in_order_and_come_with_the_result(client: evervm.Client) -> None:
    machine = client.create_machine()
    code = (
        "class Table:\n"
        "    def _repr_html_(self): return '<table><td>7</td></table>'\n"
        "    def _repr_json_(self): return {'n': 7}\n"
        "print('a')\ndisplay(Table())\nprint('b')\nTable()"
    )
    events = list(machine.stream(code))
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["OutputChunk", "RichResult", "OutputChunk", "ExecResult"]
    shown = events[1]
    assert isinstance(shown, evervm.RichResult)
    assert shown.kind == "display"
    assert shown.html == "<table><td>7</td></table>"
    assert shown.get("application/json") == {"n": 7}
    assert shown.text is not None and "Table object" in shown.text
    assert shown.png is None and shown.get("image/png") is None
    assert shown._repr_mimebundle_() == shown.data
    result = events[-1]
    assert isinstance(result, evervm.ExecResult)
    assert [r.kind for r in result.results] == ["display", "value"]
    assert result.results[0].data == shown.data
    assert result.results[1].text == result.value
    assert result.data is None


def test_errors_have_one_class_per_kind(client: evervm.Client) -> None:
    with pytest.raises(evervm.NotFoundError) as missing:
        client.machine("no-such-machine").exec("1")
    assert isinstance(missing.value, evervm.EvervmError)
    assert getattr(missing.value, "kind") == "NotFound"
    with pytest.raises(evervm.InvalidInputError):
        client.create_machine(tags={"bad key": "v"})
    with pytest.raises(evervm.InvalidInputError):
        client.create_machine(memory_mb=1)
    with pytest.raises(evervm.InvalidInputError) as bad_timeout:
        client.create_machine().exec("1", timeout=-1)
    # Also a ValueError, as a wrong argument is in Python.
    assert isinstance(bad_timeout.value, ValueError)
    assert isinstance(bad_timeout.value, evervm.EvervmError)
    assert getattr(bad_timeout.value, "kind") == "InvalidInput"
    # The process backend cannot snapshot.
    machine = client.create_machine()
    with pytest.raises(evervm.UnsupportedError):
        machine.fork()
    with pytest.raises(evervm.UnsupportedError):
        client.create_machine(durability="instruction")
    assert machine.checkpoints() == []


def test_the_default_timeout_is_the_engines(client: evervm.Client) -> None:
    assert (evervm.DEFAULT_TIMEOUT, evervm.MAX_TIMEOUT) == (15.0, 86400.0)
    machine = client.create_machine()
    assert machine.exec("1 + 1", timeout=None).value == "2"
    assert machine.exec("2 + 2", timeout=evervm.MAX_TIMEOUT).value == "4"


@pytest.mark.parametrize("timeout", [1e20, float("inf"), float("-inf"), float("nan"), -1.0, 0.0, 86400.5])
async def test_bad_timeouts_are_invalid_input_before_any_call(timeout: float) -> None:
    # Nothing listens on port 9: the timeout is refused before anything is sent.
    machine = evervm.Client("http://127.0.0.1:9", "a.b").machine("m")
    with pytest.raises(evervm.InvalidInputError, match="timeout"):
        machine.exec("1", timeout=timeout)
    with pytest.raises(evervm.InvalidInputError, match="timeout"):
        machine.stream("1", timeout=timeout)
    async_machine = evervm.AsyncClient("http://127.0.0.1:9", "a.b").machine("m")
    with pytest.raises(evervm.InvalidInputError, match="timeout"):
        await async_machine.exec("1", timeout=timeout)
    with pytest.raises(evervm.InvalidInputError, match="timeout"):
        async_machine.stream("1", timeout=timeout)


def test_a_remote_client_without_a_server_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EVERVM_URL", raising=False)
    monkeypatch.delenv("EVERVM_TOKEN", raising=False)
    with pytest.raises(evervm.InvalidInputError, match="EVERVM_URL"):
        evervm.Client()
    with pytest.raises(evervm.InvalidInputError, match="EVERVM_TOKEN"):
        evervm.Client("http://127.0.0.1:9")
    with pytest.raises(evervm.InvalidInputError, match="EVERVM_URL"):
        evervm.AsyncClient()
    with pytest.raises(ValueError, match="EVERVM_TOKEN"):
        evervm.AsyncClient("http://127.0.0.1:9")


def test_a_limit_answered_by_a_server_is_limit_exceeded() -> None:
    import http.server
    import json

    class Limited(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"code": "LimitExceeded", "id": None,
                               "message": "at most 3 machines per account"}).encode()
            self.send_response(429)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Limited)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = evervm.Client(f"http://127.0.0.1:{server.server_address[1]}", "a.b")
        with pytest.raises(evervm.LimitExceededError, match="at most 3 machines") as limited:
            client.whoami()
        assert isinstance(limited.value, evervm.EvervmError)
        assert getattr(limited.value, "kind") == "LimitExceeded"
    finally:
        server.shutdown()


def test_wrong_token_is_unauthorized(process_server) -> None:  # type: ignore[no-untyped-def]
    client = evervm.Client(process_server.url, "abc.def")
    with pytest.raises(evervm.UnauthorizedError):
        client.whoami()
    with pytest.raises(evervm.TransportError):
        evervm.Client("http://127.0.0.1:9", "a.b").whoami()


def test_interrupt_stops_a_running_instruction(client: evervm.Client) -> None:
    machine = client.create_machine()
    machine.exec("n = 1")
    threading.Timer(1.0, machine.interrupt).start()
    result = machine.exec("import time\nwhile True: time.sleep(0.05)", timeout=30)
    assert result.cause == "interrupted"
    assert machine.exec("n").value == "1"


def test_ctrl_c_during_exec_interrupts_the_instruction(client: evervm.Client) -> None:
    machine = client.create_machine()
    machine.exec("n = 2")
    # Python turns SIGINT into KeyboardInterrupt only if it was not ignored when it started (a
    # test run launched in the background inherits it ignored): as in an interactive session.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        machine.exec("import time\nwhile True: time.sleep(0.05)", timeout=60)
    signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < 10
    # The machine's instruction was interrupted too, so it answers at once.
    assert machine.exec("n", timeout=10).value == "2"


async def test_async_twins(client: evervm.Client, tmp_path: Path) -> None:
    async with await evervm.AsyncClient.local(home=tmp_path / "a", backend="process", pool_size=0) as c:
        machine = await c.create_machine(tags={"flavour": "async"})
        assert (await machine.exec("y = 6")).value is None
        results = await asyncio.gather(machine.exec("y * 7"), c.whoami())
        assert results[0].value == "42"
        events = [e async for e in machine.stream("print('a')\n'b'")]
        assert isinstance(events[0], evervm.OutputChunk) and events[0].data == "a"
        assert isinstance(events[-1], evervm.ExecResult) and events[-1].value == "'b'"
        assert (await machine.info()).tags == {"flavour": "async"}
        assert [m.name for m in await c.list_machines()] == [machine.name]
        with pytest.raises(evervm.NotFoundError):
            await c.machine("nope").info()
        await machine.delete()


ENDS_RIGHT_AFTER_ASYNC_CALLS = """
import asyncio, sys
import evervm

async def main():
    async with evervm.AsyncClient(sys.argv[1], sys.argv[2]) as client:
        machine = await client.create_machine()
        results = await asyncio.gather(*(machine.exec(f"{i} * 2") for i in range(3)))
        print([r.value for r in results])
        await machine.delete()

asyncio.run(main())
"""


def test_a_program_that_ends_right_after_async_calls_exits_cleanly(process_server) -> None:
    # The runtime's threads settle asyncio futures; one still inside Python when the interpreter
    # finalized used to crash the process at exit (SIGSEGV or SIGABRT, a third of the runs on a
    # busy host). Twelve at once keep the host busy (and hold 6 GiB of the account's 16).
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", ENDS_RIGHT_AFTER_ASYNC_CALLS, process_server.url,
             process_server.token],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(12)
    ]
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert (run.returncode, out) == (0, "['0', '2', '4']\n"), err


def test_after_fork_a_child_uses_the_server_or_is_told_why_not(client: evervm.Client) -> None:
    machine = client.create_machine()
    machine.exec("z = 5")
    local = repr(client).startswith("Client(local:")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a runtime of its own
        answer = b""
        try:
            answer = (machine.exec("z * 2", timeout=30).value or "").encode()
        except evervm.ConflictError as e:
            answer = b"conflict: " + str(e).encode()
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            answer = repr(e).encode()
        finally:
            os.write(write, answer)
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    answer = os.read(read, 1000).decode()
    if local:
        # The in-process engine stays with the parent; the child is told what to do instead.
        assert answer.startswith("conflict: ") and "Client(url, token)" in answer, answer
    else:
        assert answer == "10"
    assert machine.exec("z").value == "5"


def test_environment_and_secrets(client: evervm.Client) -> None:
    machine = client.create_machine(env={"STAGE": "py"}, secret_env={"API_KEY": "k-987654"})
    assert machine.exec("import os\n(os.environ['STAGE'], os.environ['API_KEY'])").value == "('py', 'k-987654')"
    info = machine.info()
    assert info.env == {"STAGE": "py"} and info.secret_env == ["API_KEY"]
    listed = [m for m in client.list_machines() if m.name == machine.name][0]
    assert listed.secret_env == ["API_KEY"] and "k-987654" not in repr(listed.env)
    with pytest.raises(evervm.InvalidInputError):
        client.create_machine(env={"BAD-NAME": "x"})
    machine.delete()


def test_expiry_and_pages(client: evervm.Client) -> None:
    brief = client.create_machine(ttl_seconds=3600, tags={"suite": "pages"})
    assert brief.info().expires_at
    others = [client.create_machine(tags={"suite": "pages"}) for _ in range(2)]
    first = client.list_machines_page(tags={"suite": "pages"}, limit=2)
    assert [m.name for m in first.machines] == [others[1].name, others[0].name]
    assert first.next_cursor
    rest = client.list_machines_page(tags={"suite": "pages"}, limit=2, cursor=first.next_cursor)
    assert [m.name for m in rest.machines] == [brief.name] and rest.next_cursor is None
    brief.exec("1")
    assert brief.info().interpreter == "booted"
    with pytest.raises(evervm.InvalidInputError):
        client.create_machine(ttl_seconds=-5)
    for machine in [brief, *others]:
        machine.delete()
