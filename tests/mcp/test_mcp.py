"""evervm's MCP server driven by the official MCP Python SDK (`mcp` from PyPI), over stdio
(`evervm mcp`) and streamable HTTP (`/mcp` on `evervm serve`), on gVisor."""

import base64
import json

import anyio
import httpx2
import pytest

pytestmark = pytest.mark.anyio

FOREVERVM_TOOLS = {"create-python-repl", "run-python-in-repl"}
OUR_TOOLS = {
    "list-python-repls", "fork-python-repl", "create-checkpoint", "list-checkpoints",
    "rollback-to-checkpoint", "undo-last-instruction", "rewind-python-repl",
    "swap-out-python-repl", "interrupt-python-repl", "write-file-to-repl", "read-file-from-repl",
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def text_of(result) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


async def create(client) -> str:
    result = await client.call_tool("create-python-repl", {})
    assert not result.is_error, text_of(result)
    repl_id = result.content[0].text
    assert result.structured_content == {"replId": repl_id}
    return repl_id


async def run(client, repl_id: str, code: str, **more):
    return await client.call_tool(
        "run-python-in-repl", {"pythonCode": code, "replId": repl_id, **more})


async def test_tools_are_listed_with_their_schemas(connect) -> None:
    async with connect() as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == FOREVERVM_TOOLS | OUR_TOOLS
        run_tool = tools["run-python-in-repl"]
        assert sorted(run_tool.input_schema["required"]) == ["pythonCode", "replId"]
        assert run_tool.input_schema["properties"]["pythonCode"]["type"] == "string"
        assert "output" in run_tool.output_schema["properties"]
        assert run_tool.annotations.destructive_hint is True
        assert run_tool.annotations.read_only_hint is False
        assert tools["list-python-repls"].annotations.read_only_hint is True
        assert tools["read-file-from-repl"].annotations.read_only_hint is True
        assert tools["rollback-to-checkpoint"].annotations.destructive_hint is True
        assert tools["create-python-repl"].input_schema["type"] == "object"
        for tool in tools.values():
            assert tool.output_schema is not None, tool.name
            # Only code can reach outside, in a REPL made with a network.
            expected = tool.name == "run-python-in-repl"
            assert tool.annotations.open_world_hint is expected, tool.name
            assert len(tool.description) > 40, tool.name


async def test_state_persists_and_an_exception_is_a_tool_error(connect) -> None:
    async with connect() as client:
        repl = await create(client)
        first = await run(client, repl, "x = 21\nprint('set')")
        assert not first.is_error
        body = json.loads(text_of(first))
        assert body["output"] == "set"
        assert body["result"] == "The code did not return a value"
        assert body["replId"] == repl
        second = await run(client, repl, "x * 2")
        assert second.structured_content["result"] == "42"
        assert json.loads(text_of(second))["result"] == "42"
        failed = await run(client, repl, "1 / 0")
        assert failed.is_error
        assert "ZeroDivisionError" in failed.structured_content["error"]
        assert failed.structured_content["error"].startswith("Error: ")
        listed = await client.call_tool("list-python-repls", {})
        assert repl in [r["replId"] for r in listed.structured_content["repls"]]


async def test_the_newest_and_the_handshake_protocol_versions(connect) -> None:
    for mode, version in [("auto", "2026-07-28"), ("legacy", "2025-11-25")]:
        async with connect(mode) as client:
            assert client.session.protocol_version == version
            repl = await create(client)
            result = await run(client, repl, "sum(range(10))")
            assert result.structured_content["result"] == "45"


async def test_a_plot_comes_back_as_an_image_and_the_text(connect) -> None:
    async with connect() as client:
        repl = await create(client)
        result = await run(client, repl, (
            "import matplotlib.pyplot as plt\n"
            "plt.plot([1, 2, 3], [1, 4, 9])\n"
            "print('plotted')\n"
        ))
        assert not result.is_error, text_of(result)
        images = [c for c in result.content if c.type == "image"]
        assert len(images) == 1 and images[0].mime_type == "image/png"
        assert base64.b64decode(images[0].data).startswith(b"\x89PNG")
        assert json.loads(text_of(result))["output"] == "plotted"
        assert result.structured_content["figures"] == 1


async def test_fork_checkpoint_and_rollback(connect) -> None:
    async with connect() as client:
        repl = await create(client)
        await run(client, repl, "n = 1")
        made = await client.call_tool("create-checkpoint", {"replId": repl, "name": "one"})
        assert not made.is_error, text_of(made)
        assert made.structured_content["checkpoint"]["name"] == "one"
        await run(client, repl, "n = 2")
        forked = await client.call_tool("fork-python-repl", {"replId": repl})
        assert not forked.is_error, text_of(forked)
        copy = forked.structured_content["replId"]
        assert copy != repl and forked.structured_content["forkedFrom"] == repl
        back = await client.call_tool(
            "rollback-to-checkpoint", {"replId": repl, "checkpoint": "one"})
        assert not back.is_error, text_of(back)
        assert (await run(client, repl, "n")).structured_content["result"] == "1"
        # The fork kept the state it was made with.
        assert (await run(client, copy, "n")).structured_content["result"] == "2"
        listed = await client.call_tool("list-checkpoints", {"replId": repl})
        assert [c["name"] for c in listed.structured_content["checkpoints"]] == ["one"]
        swapped = await client.call_tool("swap-out-python-repl", {"replId": copy})
        assert not swapped.is_error, text_of(swapped)
        assert (await run(client, copy, "n + 1")).structured_content["result"] == "3"


async def test_a_model_breaks_its_state_undoes_it_and_carries_on(connect) -> None:
    """The call sequence a model makes: build state, break it by mistake, undo the breaking
    call, carry on; then rewind several calls at once by an instruction number it was given."""
    async with connect() as client:
        repl = await create(client)
        built = await run(client, repl, "rows = [{'city': c, 'n': i} for i, c in enumerate('abc')]")
        assert not built.is_error, text_of(built)
        total = await run(client, repl, "sum(r['n'] for r in rows)")
        assert total.structured_content["result"] == "3"
        good = total.structured_content["instruction"]
        # The mistake: the data is overwritten.
        await run(client, repl, "rows = rows[0]['city']")
        broken = await run(client, repl, "sum(r['n'] for r in rows)")
        assert broken.is_error
        # Undo the failed call, then the one that broke the data.
        for _ in range(2):
            undone = await client.call_tool("undo-last-instruction", {"replId": repl})
            assert not undone.is_error, text_of(undone)
        assert undone.structured_content["backToInstruction"] == good
        fixed = await run(client, repl, "rows.append({'city': 'd', 'n': 3}); len(rows)")
        assert fixed.structured_content["result"] == "4"
        # Several calls back at once, by the number a result gave.
        back = await client.call_tool(
            "rewind-python-repl", {"replId": repl, "instruction": good})
        assert not back.is_error, text_of(back)
        assert back.structured_content["takenBack"] == 1
        assert (await run(client, repl, "len(rows)")).structured_content["result"] == "3"
        # A number it does not keep is a tool error the model can read.
        far = await client.call_tool("rewind-python-repl", {"replId": repl, "instruction": 999})
        assert far.is_error and "undo point" in text_of(far)


async def test_a_csv_in_and_a_result_file_out(connect) -> None:
    async with connect() as client:
        repl = await create(client)
        csv = "city,sales\nOslo,10\nLima,32\nOslo,5\n"
        written = await client.call_tool(
            "write-file-to-repl", {"replId": repl, "path": "sales.csv", "content": csv})
        assert not written.is_error, text_of(written)
        assert written.structured_content["size"] == len(csv)
        result = await run(client, repl, (
            "import pandas as pd\n"
            "totals = pd.read_csv('sales.csv').groupby('city').sales.sum()\n"
            "totals.to_csv('totals.csv')\n"
            "int(totals['Oslo'])"
        ))
        assert result.structured_content["result"] == "15", text_of(result)
        read = await client.call_tool("read-file-from-repl", {"replId": repl, "path": "totals.csv"})
        assert not read.is_error, text_of(read)
        assert text_of(read) == "city,sales\nLima,32\nOslo,15\n"
        assert read.structured_content["text"] == text_of(read)
        png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(256))).decode()
        await client.call_tool(
            "write-file-to-repl", {"replId": repl, "path": "/tmp/p.png", "contentBase64": png})
        image = await client.call_tool("read-file-from-repl", {"replId": repl, "path": "/tmp/p.png"})
        assert [c.type for c in image.content][-1] == "image"
        assert image.content[-1].data == png


async def test_progress_is_reported_while_code_runs(connect) -> None:
    async with connect() as client:
        repl = await create(client)
        progress: list[tuple[float, str | None]] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append((value, message))

        result = await client.call_tool(
            "run-python-in-repl",
            {"replId": repl, "pythonCode": (
                "import time\nfor i in range(5):\n    print('step', i, flush=True)\n"
                "    time.sleep(0.6)\n'done'")},
            progress_callback=on_progress,
        )
        assert result.structured_content["result"] == "'done'"
        assert progress, "no progress notification arrived"
        values = [v for v, _ in progress]
        assert values == sorted(values) and len(set(values)) == len(values)
        assert any(m and "step" in m for _, m in progress), progress


async def test_a_cancelled_call_interrupts_its_instruction(connect) -> None:
    async with connect() as client:
        repl = await create(client)
        await run(client, repl, "kept = 'yes'")
        # Cancelled at its first progress notification, sent once the instruction is under way.
        with anyio.CancelScope() as scope:
            async def cancel_when_running(value, total, message) -> None:
                scope.cancel()

            await client.call_tool(
                "run-python-in-repl",
                {"replId": repl, "timeoutSeconds": 120,
                 "pythonCode": "import time\ntime.sleep(60)\nfinished = True"},
                progress_callback=cancel_when_running,
            )
        assert scope.cancelled_caught
        # The instruction was interrupted (else this would wait for its minute and then find
        # `finished`), and the REPL kept its state.
        after = await run(client, repl, "(kept, 'finished' in globals())")
        assert after.structured_content["result"] == "('yes', False)", text_of(after)


async def test_bad_input_is_a_tool_error_the_model_can_read(connect) -> None:
    async with connect() as client:
        repl = await create(client)
        cases = [
            ({"pythonCode": "1"}, "missing field `replId`"),
            ({"pythonCode": 5, "replId": repl}, "invalid type"),
            ({"pythonCode": "1", "replId": "no-such-repl"}, "create-python-repl"),
            ({"pythonCode": "x = '" + "a" * (2 * 1024 * 1024) + "'", "replId": repl}, "limit"),
            ({"pythonCode": "1", "replId": repl, "timeoutSeconds": -3}, "timeoutSeconds"),
        ]
        for arguments, expected in cases:
            result = await client.call_tool("run-python-in-repl", arguments)
            assert result.is_error, arguments.keys()
            assert expected in text_of(result), text_of(result)
        for tool, arguments in [
            ("read-file-from-repl", {"replId": repl, "path": "/etc/shadow"}),
            ("write-file-to-repl", {"replId": repl, "path": "a.txt"}),
            ("write-file-to-repl", {"replId": repl, "path": "a", "contentBase64": "%%%"}),
            ("rollback-to-checkpoint", {"replId": repl, "checkpoint": "never-made"}),
            ("fork-python-repl", {}),
        ]:
            result = await client.call_tool(tool, arguments)
            assert result.is_error and text_of(result), (tool, arguments)
        # Still serving, state intact.
        assert (await run(client, repl, "2 + 2")).structured_content["result"] == "4"


async def test_a_repl_gets_the_network_it_asks_for(connect) -> None:
    # A documentation address: never reached, whatever the policy. Without a network there is
    # no route (OSError); with one, the engine's gate takes the connection, judges it and resets
    # it: nothing leaves the host.
    probe = ("import socket\n"
             "try:\n"
             "    with socket.create_connection(('198.51.100.7', 80), timeout=5) as s:\n"
             "        seen = s.recv(1) or 'closed'\n"
             "except OSError as e:\n"
             "    seen = type(e).__name__\n"
             "seen")
    async with connect() as client:
        for network, expected in [(None, "'OSError'"), ("public", "'ConnectionResetError'"),
                                  (["example.com"], "'ConnectionResetError'")]:
            arguments = {} if network is None else {"network": network}
            made = await client.call_tool("create-python-repl", arguments)
            assert not made.is_error, (network, text_of(made))
            seen = await run(client, made.content[0].text, probe)
            assert seen.structured_content["result"] == expected, (network, text_of(seen))
        bad = await client.call_tool("create-python-repl", {"network": "sideways"})
        assert bad.is_error and "network" in text_of(bad), text_of(bad)


async def test_http_needs_a_token(server) -> None:
    async with httpx2.AsyncClient() as http:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        headers = {"Accept": "application/json, text/event-stream"}
        refused = await http.post(f"{server.url}/mcp", json=body, headers=headers)
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"] == "Bearer"
        wrong = await http.post(f"{server.url}/mcp", json=body,
                                headers={**headers, "Authorization": "Bearer nope.nope"})
        assert wrong.status_code == 401


async def test_a_second_stdio_server_on_one_home_says_it_is_in_use(tmp_path) -> None:
    from conftest import Connect

    first = Connect("stdio", None, tmp_path / "home")
    second = Connect("stdio", None, tmp_path / "home")
    async with first() as a:
        await create(a)
        async with second() as b:
            # Listing tools needs no engine; a call says why there is none.
            assert len((await b.list_tools()).tools) == len(FOREVERVM_TOOLS | OUR_TOOLS)
            refused = await b.call_tool("create-python-repl", {})
            assert refused.is_error
            assert "in use" in text_of(refused) and "evervm serve" in text_of(refused)
        # The first one is unaffected.
        assert not (await a.call_tool("list-python-repls", {})).is_error
