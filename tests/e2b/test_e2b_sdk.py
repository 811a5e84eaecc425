"""E2B's unmodified Python SDK (`e2b-code-interpreter`, sync and async) against evervm's
E2B-compatible listener: what an agent written for E2B does, on machines that never die.

CI runs this file twice: with the newest SDK releases and with the oldest that honour
E2B_SANDBOX_URL (scripts/test.sh says which)."""

import asyncio
import base64
import datetime
import importlib.util
import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from importlib.metadata import version

import pytest
from e2b import CommandExitException, FileType, SandboxQuery
from e2b_code_interpreter import AsyncSandbox, Sandbox

import evervm_serve  # on the path by conftest.py

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_versions_loaded(e2b_server) -> None:
    # Says which matrix entry this is, in the log of a failing run too.
    print(f"e2b {version('e2b')}, e2b-code-interpreter {version('e2b-code-interpreter')}")
    assert version("e2b").startswith("2.")


def state_of(info) -> str:
    return getattr(info.state, "value", info.state)


def pause(sandbox) -> None:
    (getattr(sandbox, "pause", None) or sandbox.beta_pause)()


@pytest.fixture
def sandbox(e2b_server):
    suite = uuid.uuid4().hex
    sandbox = Sandbox.create(timeout=300, metadata={"suite": suite}, envs={"GREETING": "hi"})
    sandbox.suite = suite
    yield sandbox
    sandbox.kill()


def test_code_keeps_state_and_streams_output(sandbox) -> None:
    assert sandbox.run_code("x = 41").error is None
    seen_out, seen_err = [], []
    execution = sandbox.run_code(
        "import sys\nprint('out')\nprint('err', file=sys.stderr)\nx + 1",
        on_stdout=lambda m: seen_out.append(m.line),
        on_stderr=lambda m: seen_err.append(m.line),
    )
    assert execution.error is None, execution.error
    assert execution.text == "42"
    assert execution.logs.stdout == ["out\n"]
    assert execution.logs.stderr == ["err\n"]
    assert seen_out == ["out\n"] and seen_err == ["err\n"]
    # The sandbox's environment, and one call's own.
    assert sandbox.run_code("import os; os.environ['GREETING']").text == "hi"
    assert sandbox.run_code("os.environ['PER_CALL']", envs={"PER_CALL": "yes"}).text == "yes"
    assert sandbox.run_code("os.environ.get('PER_CALL')").text is None


def test_rich_results(sandbox) -> None:
    frame = sandbox.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
    assert frame.error is None, frame.error
    main = [r for r in frame.results if r.is_main_result]
    assert len(main) == 1 and "<table" in (main[0].html or ""), frame.results
    plot = sandbox.run_code(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
    assert plot.error is None, plot.error
    pngs = [r.png for r in plot.results if r.png]
    assert len(pngs) == 1, plot.results
    assert base64.b64decode(pngs[0]).startswith(PNG_SIGNATURE)


def test_code_contexts_are_interpreters_of_their_own(sandbox) -> None:
    from e2b import NotFoundException

    assert sandbox.run_code("x = 'default'").error is None
    context = sandbox.create_code_context(cwd="/tmp")
    assert (context.language, context.cwd) == ("python", "/tmp")
    homed = sandbox.create_code_context()
    assert homed.cwd == "/home/user"
    listed = sandbox.list_code_contexts()
    assert [c.id for c in listed][-2:] == [context.id, homed.id]
    assert (listed[0].language, listed[0].cwd) == ("python", "/home/user")
    # Its own globals and working directory; the sandbox's files and environment.
    sandbox.files.write("/home/user/shared.txt", "s")
    execution = sandbox.run_code(
        "import os\nx = 'ctx'\nprint(os.getcwd())\nopen('/home/user/shared.txt').read()",
        context=context)
    assert execution.error is None, execution.error
    assert (execution.logs.stdout, execution.text) == (["/tmp\n"], "s")
    assert sandbox.run_code("import os; os.getcwd()", context=homed).text == "/home/user"
    assert sandbox.run_code("x").text == "default"
    assert sandbox.run_code("x", context=context).text == "ctx"
    assert sandbox.run_code("os.environ['GREETING']", context=context).text == "hi"
    assert sandbox.run_code("os.environ['PER_CALL']", context=context,
                            envs={"PER_CALL": "c"}).text == "c"
    assert sandbox.run_code("os.environ.get('PER_CALL')", context=context).text is None
    # Restarted: its variables are gone.
    sandbox.restart_code_context(context)
    restarted = sandbox.run_code("x", context=context)
    assert (restarted.error.name, restarted.error.value) == ("NameError", "name 'x' is not defined")
    # Removed: gone, and E2B's 404 for what names it.
    sandbox.remove_code_context(context.id)
    assert context.id not in [c.id for c in sandbox.list_code_contexts()]
    with pytest.raises(NotFoundException):
        sandbox.run_code("1", context=context)
    with pytest.raises(NotFoundException):
        sandbox.restart_code_context(context.id)
    assert sandbox.run_code("x").text == "default"


def test_errors_carry_their_traceback(sandbox) -> None:
    errors = []
    execution = sandbox.run_code("def f():\n    return 1 / 0\nf()", on_error=errors.append)
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert "division by zero" in execution.error.value
    assert "return 1 / 0" in execution.error.traceback
    assert errors and errors[0].name == "ZeroDivisionError"
    # The machine is fine afterwards.
    assert sandbox.run_code("2 + 2").text == "4"


def test_errors_are_named_from_the_exception_object(sandbox) -> None:
    # smolagents recognises its final answer by the name of a class defined in a method.
    raised = sandbox.run_code(
        "def f():\n    class FinalAnswerException(Exception):\n        pass\n"
        "    raise FinalAnswerException('the answer')\nf()"
    ).error
    assert (raised.name, raised.value) == ("FinalAnswerException", "the answer")
    decoding = sandbox.run_code("import json\njson.loads('{')").error
    assert decoding.name == "JSONDecodeError"
    assert decoding.value.startswith("Expecting property name")
    two_lines = sandbox.run_code("raise ValueError('first\\nsecond')").error
    assert (two_lines.name, two_lines.value) == ("ValueError", "first\nsecond")


def test_files(sandbox) -> None:
    info = sandbox.files.write("/home/user/a.txt", "content")
    assert info.path == "/home/user/a.txt" and info.name == "a.txt"
    assert sandbox.files.read("/home/user/a.txt") == "content"
    # The machine's REPL starts in its home, which E2B calls /home/user.
    assert sandbox.run_code("open('a.txt').read()").text == "content"
    assert sandbox.run_code("open('/home/user/a.txt').read()").text == "content"
    names = [entry.name for entry in sandbox.files.list("/home/user")]
    assert "a.txt" in names
    assert sandbox.files.exists("/home/user/a.txt")
    assert not sandbox.files.exists("/home/user/missing.txt")
    assert sandbox.files.make_dir("/home/user/d")
    assert not sandbox.files.make_dir("/home/user/d"), "it exists already"
    moved = sandbox.files.rename("/home/user/a.txt", "/home/user/d/b.txt")
    assert moved.path == "/home/user/d/b.txt"
    assert sandbox.files.read("/home/user/d/b.txt", format="bytes") == b"content"
    deep = [entry.path for entry in sandbox.files.list("/home/user", depth=2)]
    assert "/home/user/d/b.txt" in deep, deep
    sandbox.files.remove("/home/user/d")
    assert not sandbox.files.exists("/home/user/d/b.txt")
    # As E2B's envd (its tests `test_remove_non_existing_file`, `test_list_directory`):
    # removing what is not there does nothing, and a listing gives each directory's entries by
    # name, a subdirectory's right after it.
    sandbox.files.remove("/home/user/never-there.txt")
    for directory in ["t/b-z", "t/b", "t/b/y", "t/b/x", "t/a-c"]:
        sandbox.files.make_dir("/home/user/" + directory)
    sandbox.files.write("/home/user/t/a.txt", "a")
    listed = [entry.path[len("/home/user/t/"):] for entry in sandbox.files.list("/home/user/t", depth=2)]
    assert listed == ["a-c", "a.txt", "b", "b/x", "b/y", "b-z"], listed
    # Symlinks as envd reports them (its `test_file_symlink`): the link's own path, its target's
    # type and mode, `L` permissions, and where it leads, resolved.
    sandbox.commands.run("ln -s a.txt link.txt && ln -s b link-dir && ln -s gone broken", cwd="/home/user/t")
    link = sandbox.files.get_info("t/link.txt")
    assert (link.path, link.type, link.symlink_target) == (
        "/home/user/t/link.txt", FileType.FILE, "/home/user/t/a.txt")
    assert (link.mode, link.permissions) == (0o644, "Lrwxrwxrwx")
    assert sandbox.files.get_info("/home/user/t/a.txt").symlink_target is None
    entries = {entry.name: entry for entry in sandbox.files.list("/home/user/t")}
    assert entries["link.txt"].type == FileType.FILE
    assert entries["link.txt"].symlink_target == "/home/user/t/a.txt"
    assert (entries["link-dir"].type, entries["link-dir"].symlink_target) == (
        FileType.DIR, "/home/user/t/b")
    # A link that leads nowhere has no type, and the SDK leaves such entries out.
    assert "broken" not in entries
    assert sandbox.files.get_info("t/link-dir").type == FileType.DIR
    assert entries["a.txt"].symlink_target is None


def test_commands(sandbox) -> None:
    lines = []
    result = sandbox.commands.run("echo out; echo err >&2; echo $GREETING",
                                  on_stdout=lines.append)
    assert result.exit_code == 0
    assert result.stdout == "out\nhi\n"
    assert result.stderr == "err\n"
    assert "".join(lines) == "out\nhi\n"
    result = sandbox.commands.run("pwd; echo $MINE", cwd="/tmp", envs={"MINE": "mine"})
    assert result.stdout == "/tmp\nmine\n"
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("echo bye; exit 3")
    assert failed.value.exit_code == 3
    assert failed.value.stdout == "bye\n"


def test_timeout_pause_and_connect_keep_state(sandbox) -> None:
    assert sandbox.run_code("kept = [1, 2, 3]").error is None
    sandbox.set_timeout(120)
    assert state_of(sandbox.get_info()) == "running"
    pause(sandbox)
    assert state_of(sandbox.get_info()) == "paused"
    assert not sandbox.is_running()
    again = Sandbox.connect(sandbox.sandbox_id, timeout=60)
    assert state_of(again.get_info()) == "running"
    assert again.run_code("sum(kept)").text == "6"


def test_list_by_metadata_and_kill(e2b_server) -> None:
    suite = uuid.uuid4().hex
    mine = [Sandbox.create(metadata={"suite": suite, "n": str(n)}) for n in range(2)]
    other = Sandbox.create(metadata={"suite": "someone-else"})
    try:
        listed = Sandbox.list(query=SandboxQuery(metadata={"suite": suite})).next_items()
        assert sorted(s.sandbox_id for s in listed) == sorted(s.sandbox_id for s in mine)
        assert all(s.metadata["suite"] == suite for s in listed)
        one = Sandbox.list(query=SandboxQuery(metadata={"suite": suite, "n": "1"})).next_items()
        assert [s.sandbox_id for s in one] == [mine[1].sandbox_id]
        assert mine[0].kill()
        listed = Sandbox.list(query=SandboxQuery(metadata={"suite": suite})).next_items()
        assert [s.sandbox_id for s in listed] == [mine[1].sandbox_id]
        assert not Sandbox.kill(mine[0].sandbox_id), "a killed sandbox is gone"
    finally:
        for sandbox in (mine[1], other):
            sandbox.kill()


def test_list_filters_and_metrics_ranges_are_honoured(e2b_server) -> None:
    """E2B's API parameters (its `test_list_sandboxes_with_order`, `_started_after`,
    `_with_template_filter`, `test_sbx_metrics_time_range`), sent as the SDKs send them, so
    that the oldest SDK, which has no arguments for them, checks them too."""
    suite = uuid.uuid4().hex
    first = Sandbox.create(metadata={"suite": suite})
    second = Sandbox.create(metadata={"suite": suite})
    key = {"X-API-Key": e2b_server.e2b_key}

    def get(path: str, **params: str):
        url = f"{e2b_server.e2b_url}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(urllib.request.Request(url, headers=key)) as answer:
            return json.load(answer)

    def listed(**params: str) -> list:
        found = get("/v2/sandboxes", metadata=f"suite={suite}", **params)
        return [s["sandboxID"] for s in found]

    try:
        both = [first.sandbox_id, second.sandbox_id]
        assert listed(order="asc") == both
        assert listed(order="desc") == both[::-1]
        assert listed() == both[::-1], "newest first unless asked"
        started = second.get_info().started_at
        assert second.sandbox_id in listed(startedAfter=started.isoformat())
        later = started + datetime.timedelta(seconds=1)
        assert listed(startedAfter=later.isoformat()) == []
        template = first.get_info().template_id
        assert sorted(listed(template=template)) == sorted(both)
        assert listed(template="unknown-template") == []
        # Every parameter is honoured or refused with 400, naming what was wrong.
        for bad, named in (({"colour": "red"}, "colour"), ({"order": "up"}, "order"),
                           ({"startedAfter": "yesterday"}, "startedAfter")):
            with pytest.raises(urllib.error.HTTPError) as refused:
                listed(**bad)
            assert refused.value.code == 400
            assert named in refused.value.read().decode(), bad

        metrics = f"/sandboxes/{first.sandbox_id}/metrics"
        now = int(time.time())
        assert len(get(metrics, start=str(now - 60), end=str(now + 1))) == 1
        assert get(metrics, start=str(now - 3600), end=str(now - 1800)) == []
        with pytest.raises(urllib.error.HTTPError) as refused:
            get(metrics, start=str(now), end=str(now - 60))
        assert refused.value.code == 400
    finally:
        first.kill()
        second.kill()


def test_async_sdk(e2b_server) -> None:
    async def scenario() -> None:
        sandbox = await AsyncSandbox.create(metadata={"suite": "async"})
        try:
            assert (await sandbox.run_code("y = 6 * 7")).error is None
            out = []
            execution = await sandbox.run_code("print(y)\ny", on_stdout=out.append)
            assert execution.text == "42" and [m.line for m in out] == ["42\n"]
            await sandbox.files.write("/home/user/async.txt", "from async")
            assert await sandbox.files.read("/home/user/async.txt") == "from async"
            result = await sandbox.commands.run("cat async.txt")
            assert result.stdout == "from async"  # exactly what cat printed
            assert (await sandbox.run_code("1/0")).error.name == "ZeroDivisionError"
        finally:
            assert await sandbox.kill()

    asyncio.run(scenario())


def test_a_client_leaving_interrupts_the_run(sandbox) -> None:
    # The SDK's timeout is the client's: it closes the connection, and the run is interrupted
    # (the machine's state is kept).
    code = ("import time\ntry:\n    time.sleep(120)\nexcept KeyboardInterrupt:\n"
            "    interrupted = True\n    raise")
    with pytest.raises(Exception) as gone:
        sandbox.run_code(code, timeout=3)
    assert "timed out" in str(gone.value).lower() or "timeout" in type(gone.value).__name__.lower()
    assert sandbox.run_code("interrupted").text == "True"


@pytest.mark.skipif(not hasattr(Sandbox, "fork"), reason="this SDK release has no fork")
def test_fork(sandbox) -> None:
    assert sandbox.run_code("base = 'parent'").error is None
    forks = sandbox.fork(count=2, timeout=120)
    try:
        assert len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks), forks
        assert len({f.sandbox_id for f in forks} | {sandbox.sandbox_id}) == 3
        for n, fork in enumerate(forks):
            assert fork.run_code("base").text == "parent"
            fork.run_code(f"base = 'fork {n}'")
        assert sandbox.run_code("base").text == "parent", "forks have their own state"
    finally:
        for fork in forks:
            if isinstance(fork, Sandbox):
                fork.kill()


def test_snapshots_outlive_their_sandbox_and_make_sandboxes(e2b_server) -> None:
    source = Sandbox.create(timeout=120)
    name = f"snap-{uuid.uuid4().hex[:8]}"
    made: list = []
    try:
        source.files.write("/home/user/data.txt", "as it was")
        assert source.run_code("counter = 41").error is None
        snapshot = source.create_snapshot(name=name)
        assert snapshot.snapshot_id == f"{name}:default", snapshot
        assert snapshot.names == [f"{name}:default"]
        unnamed = Sandbox.create_snapshot(source.sandbox_id)
        # The sandbox runs on, changed after the snapshot.
        source.files.write("/home/user/data.txt", "changed")
        ids = {s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=source.sandbox_id)
               .next_items()}
        assert ids == {snapshot.snapshot_id, unnamed.snapshot_id}
        try:
            by_name = Sandbox.list_snapshots(name=name).next_items()
        except TypeError:
            by_name = None  # (e2b 2.26's lists take no name)
        if by_name is not None:
            assert [s.snapshot_id for s in by_name] == [snapshot.snapshot_id]
        # Snapshots are not sandboxes.
        listed = {s.sandbox_id for s in Sandbox.list().next_items()}
        assert source.sandbox_id in listed
        assert not any(i.split(":")[0] in listed for i in ids)
    finally:
        source.kill()
    try:
        # Made from the snapshot after its sandbox was killed: its files and its memory.
        made = [Sandbox.create(snapshot.snapshot_id, timeout=120) for _ in range(2)]
        for sandbox in made:
            assert sandbox.files.read("/home/user/data.txt") == "as it was"
            assert sandbox.run_code("counter + 1").text == "42"
        made[0].files.write("/home/user/data.txt", "mine")
        assert made[1].files.read("/home/user/data.txt") == "as it was"
        # A name taken again replaces its snapshot.
        again = made[0].create_snapshot(name=name)
        made.append(Sandbox.create(again.snapshot_id, timeout=60))
        assert made[-1].files.read("/home/user/data.txt") == "mine"
    finally:
        for sandbox in made:
            sandbox.kill()
    assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True
    assert Sandbox.delete_snapshot(snapshot.snapshot_id) is False
    assert Sandbox.delete_snapshot(unnamed.snapshot_id) is True
    with pytest.raises(Exception, match="not found"):
        Sandbox.create(snapshot.snapshot_id, timeout=60)


def test_a_sandbox_past_its_timeout_is_paused_not_killed(sandbox) -> None:
    assert sandbox.run_code("survivor = 'still here'").error is None
    sandbox.set_timeout(1)
    # The server's clock runs out and it swaps the machine out: wait for that state.
    deadline = time.monotonic() + 60
    while state_of(sandbox.get_info()) != "paused":
        assert time.monotonic() < deadline, "the sandbox was not paused after its timeout"
        time.sleep(0.2)
    assert not sandbox.is_running()
    again = Sandbox.connect(sandbox.sandbox_id, timeout=120)
    assert again.run_code("survivor").text == "still here"


def test_no_answer_carries_the_account_key(e2b_server) -> None:
    import httpx

    key = e2b_server.e2b_key
    token = bytes.fromhex(key.removeprefix("e2b_")).decode()
    sdk = {"X-API-Key": key, "lang": "python", "package_version": version("e2b")}
    with httpx.Client(base_url=e2b_server.e2b_url, headers=sdk, timeout=120) as http:
        created = http.post("/sandboxes", json={"templateID": "base", "timeout": 120})
        assert created.status_code == 201, created.text
        sandbox_id = created.json()["sandboxID"]
        other = http.post("/sandboxes", json={"templateID": "base", "timeout": 120}).json()
        try:
            answers = [
                created,
                http.get(f"/sandboxes/{sandbox_id}"),
                http.get("/v2/sandboxes"),
                http.post(f"/sandboxes/{sandbox_id}/connect", json={"timeout": 120}),
            ]
            for answer in answers:
                assert answer.is_success, answer.text
                assert key not in answer.text and token not in answer.text, answer.request.url
            access = created.json()["envdAccessToken"]
            assert access.startswith("e2bs_")
            # The domain leads back here: an SDK that ignores E2B_SANDBOX_URL builds URLs
            # whose host is this listener.
            host = httpx.URL(e2b_server.e2b_url).netloc.decode()
            assert created.json()["domain"] == f"sdk-too-old@{host}"

            def run(sandbox: str, credential: str) -> httpx.Response:
                return http.post(
                    "/execute",
                    json={"code": "6 * 7"},
                    headers={
                        "X-Access-Token": credential,
                        "E2b-Sandbox-Id": sandbox,
                        "E2b-Sandbox-Port": "49999",
                        "X-API-Key": "",
                    },
                )

            ran = run(sandbox_id, access)
            assert ran.status_code == 200 and '"text":"42"' in ran.text, ran.text
            # The sandbox's token opens that sandbox only, and is no API key.
            assert run(other["sandboxID"], access).status_code == 401
            refused = http.get("/v2/sandboxes", headers={"X-API-Key": access})
            assert refused.status_code == 401
        finally:
            for sandbox in (sandbox_id, other["sandboxID"]):
                http.delete(f"/sandboxes/{sandbox}")


def test_output_is_passed_through_exactly(sandbox) -> None:
    assert sandbox.run_code("print('x', end='')").logs.stdout == ["x"]
    assert "".join(sandbox.run_code("print('a'); print('b', end='!')").logs.stdout) == "a\nb!"
    assert sandbox.commands.run("printf abc").stdout == "abc"


def test_cells_run_as_in_a_jupyter_kernel(sandbox) -> None:
    # A cell whose lines are all indented, as agents often write them.
    assert sandbox.run_code("\n    import os\n    value = 40 + 2\n    value").text == "42"
    assert "".join(sandbox.run_code("!echo from-the-shell").logs.stdout).strip() == "from-the-shell"
    shown = sandbox.run_code("from IPython.display import display, Markdown\ndisplay(Markdown('**b**'))")
    assert shown.error is None, shown.error
    assert [r.markdown for r in shown.results] == ["**b**"]
    frame = sandbox.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2, 3]})")
    assert frame.results[0].data == {"a": [1, 2, 3]}
    assert sandbox.run_code("[1, 2]").results[0].json == [1, 2]
    # As E2B's template: an image saved to a path is also shown.
    saved = sandbox.run_code(
        "from PIL import Image\nImage.new('RGB', (4, 4)).save('dot.png')\nprint('saved')"
    )
    assert saved.error is None, saved.error
    assert base64.b64decode(saved.results[0].png).startswith(PNG_SIGNATURE)
    # E2B's charts: a figure's `chart`, read by e2b_charts (the data image has it).
    bars = sandbox.run_code(
        "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [3, 1])\nplt.title('t')\nplt.show()"
    )
    assert bars.error is None, bars.error
    chart = bars.results[0].chart
    assert (chart.type.value, chart.title) == ("bar", "t")
    assert [(e.label, e.value) for e in chart.elements] == [("a", 3.0), ("b", 1.0)]


def test_cells_are_numbered_as_a_kernel_numbers_them(sandbox) -> None:
    # The kernel counts its cells: a command in between is not one.
    first = sandbox.run_code("1")
    assert sandbox.commands.run("true").exit_code == 0
    second = sandbox.run_code("2")
    failed = sandbox.run_code("1 / 0")
    after = sandbox.run_code("3")
    assert [c.execution_count for c in (first, second, failed, after)] == [1, 2, 3, 4]


HEALTH_CHECK = 'curl -s -o /dev/null -w "%{http_code}" http://0.0.0.0:49999/health'


def test_the_interpreter_answers_its_health_check_and_comes_back_when_killed(sandbox) -> None:
    # As in E2B's sandboxes, a program inside asks the code interpreter whether it is up.
    sandbox.run_code("kept = 1")
    assert sandbox.commands.run(HEALTH_CHECK).stdout == "200"
    assert sandbox.commands.run(HEALTH_CHECK.replace("health", "other")).stdout == "404"
    # Killed (it is the sandbox's first process), it takes the sandbox and its state with it:
    # the command's answer breaks off, as when an E2B sandbox dies. The next command gets a
    # fresh sandbox, whose interpreter answers again, and the next cell says what was lost.
    # (the newest SDKs say it could not be reached, the oldest pass the broken stream on)
    with pytest.raises(Exception, match="could not be reached|killed|peer closed"):
        sandbox.commands.run("kill -9 1")
    after = sandbox.commands.run(HEALTH_CHECK)
    assert after.stdout == "200"
    lost = sandbox.run_code("x = 1; x")
    assert lost.text == "1"
    assert "earlier state was lost" in "".join(lost.logs.stderr)
    assert sandbox.run_code("kept").error.name == "NameError"


@pytest.mark.parametrize("how", ["run_code", "commands"])
def test_a_sandbox_killed_during_a_run_is_reported_as_killed(e2b_server, how) -> None:
    import threading

    from e2b import TimeoutException

    sandbox = Sandbox.create(timeout=120)
    running = threading.Event()

    def kill_once_running() -> None:
        running.wait(60)
        Sandbox.kill(sandbox.sandbox_id)

    killer = threading.Thread(target=kill_once_running)
    killer.start()
    import e2b
    import httpcore

    # The stream breaks off and the SDK, finding the sandbox gone, says it was killed; SDK
    # releases before SandboxNotRunningException only pass on the broken stream for commands.
    says_killed = how == "run_code" or hasattr(e2b.exceptions, "SandboxNotRunningException")
    expected = (
        pytest.raises(TimeoutException, match="killed")
        if says_killed
        else pytest.raises(httpcore.RemoteProtocolError, match="incomplete chunked read")
    )
    try:
        with expected:
            if how == "run_code":
                sandbox.run_code(
                    "print('running', flush=True)\nimport time\ntime.sleep(60)",
                    on_stdout=lambda _: running.set(),
                )
            else:
                sandbox.commands.run(
                    "echo running; sleep 60", on_stdout=lambda _: running.set(), timeout=90
                )
    finally:
        running.set()
        killer.join()


def test_the_sandbox_is_e2bs_user_home_and_processes(sandbox) -> None:
    # As in E2B: `user` in /home/user, with sudo; root only through sudo.
    who = sandbox.commands.run("whoami; pwd; echo $HOME; sudo id -u; id -u")
    assert who.stdout.split() == ["user", "/home/user", "/home/user", "0", "1000"]
    # A command is a real process with its own pid, beside the code, with stdin.
    cat = sandbox.commands.run("cat", background=True, stdin=True)
    assert sandbox.commands.run(f"kill -0 {cat.pid} && echo alive").stdout == "alive\n"
    assert sandbox.run_code("6 * 7").text == "42"
    follower = sandbox.commands.connect(cat.pid)
    assert cat.pid in [p.pid for p in sandbox.commands.list()]
    sandbox.commands.kill(cat.pid)
    with pytest.raises(CommandExitException):
        cat.wait()
    with pytest.raises(CommandExitException):
        follower.wait()
    first_line = sandbox.commands.run("head -n 1", background=True, stdin=True)
    sandbox.commands.send_stdin(first_line.pid, "hello\nnot this\n")
    assert first_line.wait().stdout == "hello\n"
    with pytest.raises(CommandExitException):
        sandbox.commands.run(f"kill -0 {cat.pid}")


def test_watches_metadata_and_signed_urls(e2b_server) -> None:
    import inspect

    from e2b import FilesystemEventType

    sandbox = Sandbox.create(timeout=300, secure=True)
    try:
        sandbox.files.make_dir("watched")
        handle = sandbox.files.watch_dir("watched", recursive=True)
        sandbox.files.write("watched/a.txt", "first")
        events = [(e.name, e.type) for e in handle.get_new_events()]
        assert events == [
            ("a.txt", FilesystemEventType.CREATE),
            ("a.txt", FilesystemEventType.CHMOD),
            ("a.txt", FilesystemEventType.WRITE),
        ]
        sandbox.files.remove("watched/a.txt")
        assert ("a.txt", FilesystemEventType.REMOVE) in [
            (e.name, e.type) for e in handle.get_new_events()
        ]
        handle.stop()
        if "metadata" in inspect.signature(sandbox.files.write).parameters:
            info = sandbox.files.write("m.txt", "x", metadata={"Author": "mish"})
            assert info.metadata == {"author": "mish"}
            assert sandbox.files.get_info("m.txt").metadata == {"author": "mish"}
            assert sandbox.files.write("m.txt", "y").metadata is None
        sandbox.files.write("signed.txt", "signed content")
        with urllib.request.urlopen(sandbox.download_url("signed.txt", "user")) as answer:
            assert answer.read() == b"signed content"
        forged = sandbox.download_url("signed.txt", "user").replace("v1_", "v1_x")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(forged)
        assert refused.value.code == 401
    finally:
        sandbox.kill()


def test_the_async_sdk_watches_as_a_stream(e2b_server) -> None:
    from e2b import FilesystemEventType

    async def scenario() -> list:
        sandbox = await AsyncSandbox.create(timeout=300)
        try:
            await sandbox.files.make_dir("streamed")
            seen = []
            written = asyncio.Event()

            def on_event(event) -> None:
                seen.append((event.name, event.type))
                if event.type == FilesystemEventType.WRITE:
                    written.set()

            handle = await sandbox.files.watch_dir("streamed", on_event=on_event)
            await sandbox.files.write("streamed/b.txt", "data")
            await asyncio.wait_for(written.wait(), timeout=60)
            await handle.stop()
            return seen
        finally:
            await sandbox.kill()

    seen = asyncio.run(scenario())
    assert seen[0] == ("b.txt", FilesystemEventType.CREATE), seen


def test_a_port_is_reached_through_get_host_across_a_swap(e2b_server) -> None:
    import httpx

    sandbox = Sandbox.create(timeout=300)
    try:
        sandbox.files.write("/home/user/site/index.html", "served from the sandbox")
        sandbox.commands.run("python3 -m http.server 8000 --directory /home/user/site",
                             background=True)
        # get_host's name under evervm's default domain: httpx (as E2B's tests use) sends its
        # user part, which routes the request; the SDK adds no scheme, and evervm speaks http.
        url = "http://" + sandbox.get_host(8000) + "/index.html"
        owner = {"e2b-traffic-access-token": sandbox.traffic_access_token}
        response = evervm_serve.get_until_served(url, owner)
        assert response.status_code == 200, response.text
        assert response.text == "served from the sandbox"
        # Private by default: no token, E2B's refusal.
        refused = httpx.get(url, timeout=30)
        assert refused.status_code == 403, refused.text
        assert "e2b-traffic-access-token" in refused.json()["message"]
        # A port nothing listens on.
        closed = httpx.get("http://" + sandbox.get_host(8001) + "/", headers=owner, timeout=30)
        assert closed.status_code == 502, closed.text
        assert closed.json()["port"] == 8001
        # Paused (swapped out), the server is restored by the next request to it.
        pause(sandbox)
        assert state_of(sandbox.get_info()) == "paused"
        # The server listened before the pause: the first request after it is answered.
        again = httpx.get(url, headers=owner, timeout=30)
        assert again.status_code == 200, again.text
        assert again.text == "served from the sandbox"
        assert state_of(sandbox.get_info()) == "running"
        # An asyncio (epoll) server across a swap too.
        assert sandbox.run_code("""
import asyncio, threading
async def _answer(reader, writer):
    await reader.readuntil(b"\\r\\n\\r\\n")
    writer.write(b"HTTP/1.1 200 OK\\r\\ncontent-length: 5\\r\\nconnection: close\\r\\n\\r\\nasync")
    await writer.drain()
    writer.close()
def _serve():
    loop = asyncio.new_event_loop()
    loop.run_until_complete(asyncio.start_server(_answer, "127.0.0.1", 8002))
    loop.run_forever()
threading.Thread(target=_serve, daemon=True).start()
""").error is None
        async_url = "http://" + sandbox.get_host(8002) + "/"
        assert evervm_serve.get_until_served(async_url, owner).text == "async"
        pause(sandbox)
        assert httpx.get(async_url, headers=owner, timeout=30).text == "async"
    finally:
        sandbox.kill()
    gone = httpx.get(url, headers=owner, timeout=30)
    assert gone.status_code == 502, gone.text
    assert gone.json()["message"] == "The sandbox was not found"


def test_a_public_sandbox_answers_anyone_and_its_servers_see_the_masked_host(e2b_server) -> None:
    sandbox = Sandbox.create(timeout=120, network={
        "allow_public_traffic": True, "mask_request_host": "custom-host.example.com:${PORT}"})
    try:
        # A server that answers with the Host it was sent.
        sandbox.files.write("/home/user/host.py", """
import http.server
class Host(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        # The names as they came: title case, as E2B's proxy sends them.
        body = "|".join(f"{k}: {v}" for k, v in self.headers.items() if k == "Host").encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", 8000), Host).serve_forever()
""")
        sandbox.commands.run("python3 /home/user/host.py", background=True)
        response = evervm_serve.get_until_served("http://" + sandbox.get_host(8000) + "/", {})
        assert response.status_code == 200, response.text
        assert response.text == "Host: custom-host.example.com:8000"
    finally:
        sandbox.kill()


def _machine_network(e2b_server, sandbox_id: str) -> dict:
    """The network evervm gave a sandbox's machine, as evervm's own API shows it."""
    request = urllib.request.Request(f"{e2b_server.url}/v1/machine/{sandbox_id}",
                                     headers={"Authorization": f"Bearer {e2b_server.token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["network"]


def test_network_requests_are_applied_or_refused_by_name(e2b_server) -> None:
    from e2b import InvalidArgumentException, SandboxException

    # No internet asked for: none given (the server's default may be public).
    closed = Sandbox.create(timeout=60, allow_internet_access=False)
    try:
        assert _machine_network(e2b_server, closed.sandbox_id)["mode"] == "none"
        # A filesystem-only pause and a network change are refused, and the sandbox runs on.
        if importlib.util.find_spec("e2b.api.client.models.sandbox_pause_request"):
            # (Older SDKs take no keep_memory, and send no pause body.)
            with pytest.raises(SandboxException, match="filesystem-only pause"):
                closed.pause(keep_memory=False)
        if hasattr(closed, "update_network"):
            with pytest.raises(SandboxException, match="update_network"):
                closed.update_network({"deny_out": ["198.18.0.10"]})
        assert closed.run_code("1 + 1").text == "2"
    finally:
        closed.kill()
    # Everything denied but a list: that list.
    listed = Sandbox.create(timeout=60, network={
        "deny_out": ["0.0.0.0/0"], "allow_out": ["pypi.org", "198.18.0.0/24"]})
    try:
        network = _machine_network(e2b_server, listed.sandbox_id)
        assert network == {"mode": "allow", "allow": ["pypi.org", "198.18.0.0/24"]}, network
    finally:
        listed.kill()
    # A single block denied (evervm has no deny lists), and E2B's egress transforms: refused.
    for network in ({"deny_out": ["198.18.0.10"]},
                    {"rules": {"api.example.com": [{"transform": {"headers": {"X-A": "b"}}}]}}):
        with pytest.raises((InvalidArgumentException, SandboxException), match="network"):
            Sandbox.create(timeout=60, network=network)


def test_a_pty_is_a_terminal_of_its_size(sandbox) -> None:
    from e2b.sandbox.commands.command_handle import PtySize

    terminal = sandbox.pty.create(PtySize(cols=80, rows=24), envs={"ABC": "123"}, cwd="/")
    sandbox.pty.send_stdin(terminal.pid, b"echo $ABC; stty size; tty\n")
    sandbox.pty.resize(terminal.pid, PtySize(cols=100, rows=30))
    # A client may leave and come back: the terminal goes on.
    terminal.disconnect()
    again = sandbox.pty.connect(terminal.pid)
    assert again.pid == terminal.pid
    sandbox.pty.send_stdin(terminal.pid, b"stty size; exit 3\n")
    seen = []
    with pytest.raises(CommandExitException) as ended:
        again.wait(on_pty=lambda data: seen.append(data.decode()))
    assert ended.value.exit_code == 3
    output = "".join(seen)
    assert "30 100" in output, output
    # Killed, it is gone.
    killed = sandbox.pty.create(PtySize(cols=80, rows=24))
    assert sandbox.pty.kill(killed.pid)
    with pytest.raises(CommandExitException):
        sandbox.commands.run(f"kill -0 {killed.pid}")
    assert not sandbox.pty.kill(999999)


def test_the_shell_has_what_e2bs_base_image_has(sandbox) -> None:
    # Commands run in bash, and git and tput are there, as in E2B's base image.
    assert sandbox.commands.run("echo $BASH_VERSION").stdout.strip() != ""
    assert sandbox.commands.run("git --version").stdout.startswith("git version")
    from e2b.sandbox.commands.command_handle import PtySize

    terminal = sandbox.pty.create(PtySize(cols=93, rows=24))
    sandbox.pty.send_stdin(terminal.pid, b"tput cols; exit\n")
    seen = []
    assert terminal.wait(on_pty=lambda data: seen.append(data.decode())).exit_code == 0
    assert "93" in "".join(seen).split("exit", 1)[-1], seen


def test_templates_exist_as_the_sdk_asks(e2b_server) -> None:
    from e2b import Template

    assert Template.exists("base")
    assert Template.exists("code-interpreter-v1")
    assert not Template.exists("no-such-template")
