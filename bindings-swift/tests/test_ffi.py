"""Every export of the Swift package, through the same library and uniffi's Python bindings:
the scenarios a Swift user runs (`exec` is `start_exec` + `result`, as the Swift wrapper does;
a cancelled Swift Task calls `cancel`)."""

import asyncio

import pytest


def run(coroutine):
    return asyncio.run(coroutine)


def test_exec_values_output_errors_and_listing(ffi, server) -> None:
    async def scenario() -> None:
        client = ffi.Client(server.url, server.token)
        assert await client.whoami() == "default"
        machine = await client.create_machine(tags={"app": "swift-ffi"}, memory_mb=512)
        first = await machine.start_exec("x = 21\nprint('set')", None).result()
        assert first.value is None and first.stdout == "set\n" and first.seq == 0
        second = await machine.start_exec("x * 2", 30.0).result()
        assert second.value == "42" and not second.timed_out
        failed = await machine.start_exec("1 / 0", None).result()
        assert failed.error is not None and "ZeroDivisionError" in failed.error
        assert failed.exception is not None
        assert (failed.exception.name, failed.exception.value) == ("ZeroDivisionError", "division by zero")
        listed = await client.list_machines({"app": "swift-ffi"})
        assert [m.name for m in listed] == [machine.name()]
        info = await machine.info()
        assert info.tags == {"app": "swift-ffi"} and info.memory_mb == 512
        assert info.instruction_count == 3
        assert (await client.machine(machine.name()).info()).name == machine.name()
        plot = await machine.start_exec(
            "import matplotlib.pyplot as plt\nplt.plot([1, 2])\n'drawn'", None).result()
        assert plot.png is not None and plot.png.startswith(b"\x89PNG")
        assert [r.kind for r in plot.results] == [ffi.RichKind.FIGURE]
        await machine.delete()

    run(scenario())


def test_errors_are_one_enum_with_a_case_per_kind(ffi, server) -> None:
    async def scenario() -> None:
        try:
            ffi.Client("ftp://nowhere", "a.b")
            raise AssertionError("ftp is no server")
        except ffi.EvervmError.InvalidInput as e:
            assert "ftp" in e.message
        try:
            ffi.Client.trusting(server.url, server.token, "/nonexistent/ca.pem")
            raise AssertionError("a CA file that is not there")
        except ffi.EvervmError.InvalidInput as e:
            assert "/nonexistent/ca.pem" in e.message
        stranger = ffi.Client(server.url, "nope.nope")
        try:
            await stranger.list_machines(None)
            raise AssertionError("a made-up token")
        except ffi.EvervmError.Unauthorized:
            pass
        client = ffi.Client(server.url, server.token)
        try:
            await client.machine("no-such-machine").info()
            raise AssertionError("no such machine")
        except ffi.EvervmError.NotFound as e:
            assert "no-such-machine" in e.message
        machine = await client.create_machine()
        try:
            machine.start_exec("1", -1.0)
            raise AssertionError("a negative timeout")
        except ffi.EvervmError.InvalidInput as e:
            assert "timeoutSeconds" in e.message
        await machine.delete()

    run(scenario())


def test_cancel_interrupts_the_instruction_and_keeps_the_state(ffi, server) -> None:
    async def scenario() -> None:
        client = ffi.Client(server.url, server.token)
        machine = await client.create_machine()
        await machine.start_exec("kept = 'yes'", None).result()
        # Cancelled at once: the instruction is started all the same, then interrupted (the
        # stream below is cancelled once its instruction has printed).
        pending = machine.start_exec("import time\ntime.sleep(60)\nfinished = True", 120.0)
        pending.cancel()
        try:
            await asyncio.wait_for(pending.result(), 30)
            raise AssertionError("a cancelled instruction")
        except ffi.EvervmError.Cancelled as e:
            assert "interrupted" in e.message
        after = await machine.start_exec("(kept, 'finished' in globals())", None).result()
        assert after.value == "('yes', False)"
        stream = machine.stream("import time\nprint('begun', flush=True)\ntime.sleep(60)", None)
        first = await stream.next()
        assert first.is_OUTPUT() and first.chunk.data == "begun"
        stream.cancel()
        try:
            while await stream.next() is not None:
                pass
            raise AssertionError("a cancelled stream")
        except ffi.EvervmError.Cancelled:
            pass
        assert (await machine.start_exec("kept", None).result()).value == "'yes'"
        assert await machine.interrupt() is False
        await machine.delete()

    run(scenario())


def test_streaming_gives_output_rich_results_then_the_result(ffi, server) -> None:
    async def scenario() -> None:
        client = ffi.Client(server.url, server.token)
        machine = await client.create_machine()
        stream = machine.stream(
            "for i in range(3):\n    print(i)\nimport matplotlib.pyplot as plt\n"
            "plt.plot([1, 3]); plt.show()\n'done'", None)
        events = []
        while (event := await stream.next()) is not None:
            events.append(event)
        outputs = [e.chunk.data for e in events if e.is_OUTPUT()]
        assert outputs == ["0", "1", "2"]
        assert any(e.is_RICH() and e.result.png for e in events)
        last = events[-1]
        assert last.is_FINISHED() and last.result.value == "'done'"
        assert last.result.stdout == "0\n1\n2\n"
        await machine.delete()

    run(scenario())


def test_files_in_and_out(ffi, server) -> None:
    async def scenario() -> None:
        client = ffi.Client(server.url, server.token)
        machine = await client.create_machine()
        await machine.make_dir("data", False)
        written = await machine.write_file("data/a.bin", bytes(range(256)))
        assert written.size == 256 and written.kind == ffi.FileKind.FILE
        assert await machine.read_file("data/a.bin") == bytes(range(256))
        assert (await machine.stat_file("data/a.bin")).path == written.path
        made = await machine.make_dir("/tmp/x/y", True)
        assert made.kind == ffi.FileKind.DIRECTORY
        listing = await machine.list_files("data")
        assert [e.name for e in listing.entries] == ["a.bin"] and not listing.truncated
        seen = await machine.start_exec("len(open('data/a.bin', 'rb').read())", None).result()
        assert seen.value == "256"
        await machine.remove_file("data", True)
        try:
            await machine.stat_file("data/a.bin")
            raise AssertionError("removed")
        except ffi.EvervmError.NotFound:
            pass
        await machine.delete()

    run(scenario())


def test_fork_checkpoints_rollback_and_swap(ffi, server) -> None:
    async def scenario() -> None:
        client = ffi.Client(server.url, server.token)
        machine = await client.create_machine(tags={"t": "1"})
        await machine.start_exec("n = 1", None).result()
        made = await machine.checkpoint("one")
        assert made.name == "one" and made.instruction_count == 1
        await machine.start_exec("n = 2", None).result()
        copy = await machine.fork({"t": "copy"})
        assert (await copy.info()).tags == {"t": "copy"}
        rolled = await machine.rollback("one")
        assert rolled.name == machine.name()
        assert (await machine.start_exec("n", None).result()).value == "1"
        assert (await copy.start_exec("n", None).result()).value == "2"
        assert [c.name for c in await machine.checkpoints()] == ["one"]
        await machine.delete_checkpoint("one")
        assert await machine.checkpoints() == []
        await copy.swap_out()
        assert (await copy.info()).state == "swapped"
        assert (await copy.start_exec("n + 1", None).result()).value == "3"
        await copy.delete()
        await machine.delete()

    run(scenario())


def test_contexts_have_their_own_globals_and_cwd(ffi, server) -> None:
    async def scenario() -> None:
        client = ffi.Client(server.url, server.token)
        machine = await client.create_machine(image="minimal")
        made = await machine.start_exec(
            "import os, tempfile\nprint(os.path.realpath(tempfile.mkdtemp(prefix='ctx-')))").result()
        cwd = made.stdout.strip()
        assert cwd.startswith("/"), made.error
        context = await machine.create_context(cwd)
        assert context.cwd == cwd and context.id != "default"
        assert [c.id for c in await machine.contexts()] == ["default", context.id]
        await machine.start_exec("x = 1").result()
        missing = await machine.start_exec("x", None, context.id).result()
        assert missing.exception is not None and missing.exception.name == "NameError"
        here = await machine.start_exec("import os\nos.getcwd()", context=context.id).result()
        assert here.value == repr(cwd)
        stream = machine.stream("y = 2\nprint(os.getcwd())", None, context.id)
        events = []
        while (event := await stream.next()) is not None:
            events.append(event)
        assert [e.chunk.data for e in events if e.is_OUTPUT()] == [cwd]
        restarted = await machine.restart_context(context.id)
        assert (restarted.id, restarted.cwd) == (context.id, cwd)
        forgotten = await machine.start_exec("y", context=context.id).result()
        assert forgotten.exception is not None and forgotten.exception.name == "NameError"
        assert (await machine.start_exec("x").result()).value == "1"
        await machine.remove_context(context.id)
        assert [c.id for c in await machine.contexts()] == ["default"]
        gone = await machine.start_exec("1", context=context.id).result()
        assert gone.exception is not None and gone.exception.name == "ContextNotFound"
        try:
            await machine.restart_context(context.id)
            raise AssertionError("restarted a removed context")
        except ffi.EvervmError.NotFound:
            pass
        try:
            await machine.remove_context("default")
            raise AssertionError("removed the default context")
        except ffi.EvervmError.InvalidInput:
            pass
        home = await machine.create_context()
        assert (await machine.start_exec("1 + 1", context=home.id).result()).value == "2"
        await machine.delete()

    run(scenario())


def test_undo_rewind_and_history(ffi, server) -> None:
    async def scenario() -> None:
        client = ffi.Client(server.url, server.token)
        try:
            machine = await client.create_machine(image="minimal", history=3)
        except ffi.EvervmError.Unsupported as e:
            pytest.skip(f"the server cannot keep undo points here: {e.message}")
        info = await machine.info()
        assert (info.history, info.parent, info.forked_at) == (3, None, None)
        await machine.start_exec("x = 1", None).result()
        await machine.start_exec("x = 2", None).result()
        undone = await machine.undo()
        assert (undone.to, undone.rewound) == (0, 1)
        history = await machine.history(None)
        assert (history.keeps, history.initial_point) == (3, True)
        assert [(i.seq, i.code, i.rewound) for i in history.instructions] == [
            (0, "x = 1", False), (1, "x = 2", True)]
        assert history.instructions[0].undo_point
        assert [i.seq for i in (await machine.history(1)).instructions] == [1]
        looked = await machine.start_exec("x", None).result()
        assert looked.value == "1"
        assert (await machine.rewind(0)).to == 0
        assert (await machine.start_exec("x", None).result()).value == "1"
        copy = await machine.fork(None)
        copied = await copy.info()
        assert (copied.parent, copied.forked_at) == (machine.name(), looked.seq + 1)
        await copy.delete()
        await machine.start_exec("x = 5", None).result()
        early = await machine.fork(None, 0)  # right after instruction 0; the machine untouched
        early_info = await early.info()
        assert (early_info.parent, early_info.forked_at) == (machine.name(), 0)
        assert (await early.start_exec("x", None).result()).value == "1"
        assert (await machine.start_exec("x", None).result()).value == "5"
        lineage = await early.lineage()
        assert lineage.root == machine.name()
        assert [(m.name, m.parent, m.forked_at) for m in lineage.machines] == [
            (machine.name(), None, None), (early.name(), machine.name(), 0)]
        assert [(t.first, t.last, t.by) for t in lineage.machines[0].taken_back] == [
            (1, 2, "rewind to 0")]
        await early.delete()
        plain = await client.create_machine(image="minimal")
        try:
            await plain.undo()
            raise AssertionError("a machine without history undid")
        except ffi.EvervmError.Conflict as e:
            assert "history" in e.message
        await plain.delete()
        await machine.delete()

    run(scenario())


def test_install_and_network(ffi, server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # `server` for its checks (gVisor, root); this test needs a server of its own, with an index.
    import evervm_serve
    import package_index

    index = package_index.Index(tmp_path / "index", {
        "evervm-swift-hello": [package_index.wheel("evervm-swift-hello", "1.0", "evervm_swift_hello", "WORD = 'hi'\n")],
    })
    served = evervm_serve.Server("gvisor", "evervm-swift-index-", env={"EVERVM_PACKAGE_INDEX": index.url})

    async def scenario() -> None:
        client = ffi.Client(served.url, served.token)
        machine = await client.create_machine(image="minimal")
        report = await machine.install(["evervm-swift-hello==1.0"])
        assert [(p.name, p.version) for p in report.installed] == [("evervm-swift-hello", "1.0")]
        assert len(report.installed[0].sha256) == 64
        assert (await machine.start_exec("import evervm_swift_hello; evervm_swift_hello.WORD", None).result()).value == "'hi'"
        try:
            await machine.install(["not a requirement!"])
        except ffi.EvervmError.InvalidInput:
            pass
        else:
            raise AssertionError("a bad requirement was accepted")
        info = await machine.info()
        assert (info.network, info.network_allow) == ("none", [])
        allowed = await client.create_machine(image="minimal", network_allow=["pypi.org"])
        info = await allowed.info()
        assert (info.network, info.network_allow) == ("allow", ["pypi.org"])
        for bad in [{"network": "allow"}, {"network": "public", "network_allow": ["a.com"]}, {"network": "open"}]:
            try:
                await client.create_machine(**bad)
            except ffi.EvervmError.InvalidInput:
                continue
            raise AssertionError(f"{bad} was accepted")
        await allowed.delete()
        await machine.delete()

    try:
        run(scenario())
    finally:
        served.stop()
        index.stop()
