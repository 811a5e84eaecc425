"""An agent framework's E2B integration, unchanged, against `evervm serve --e2b-listen`.

The framework is LangChain's Deep Agents with `langchain-e2b`, E2B's own package that adapts an
E2B sandbox (the `e2b` SDK's `Sandbox` / `AsyncSandbox`) to Deep Agents' sandbox backend: the
agent's `execute` tool runs `sandbox.commands.run`, its `write_file` tool `sandbox.files.write`
(after a preflight command), its `read_file`, `ls` and `edit_file` tools run commands. The model
is scripted (no network, no key): it asks for tool calls and then answers from what the tools
returned. Everything else (the agent loop, the tools, the E2B SDK) is the packages' own code,
pointed at evervm only by E2B's environment variables (E2B_API_URL, E2B_SANDBOX_URL,
E2B_API_KEY). As `langchain-e2b` intends, the test creates and kills the sandbox with the E2B
SDK and hands it to the backend.

Requirements: tests/e2b/requirements-framework.txt. The server and the SDK's environment are
conftest.py's `e2b_server` (gVisor and root: skipped locally without them, a failure in CI)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import e2b
import pytest
from deepagents import create_deep_agent
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_e2b import AsyncE2BSandbox, E2BSandbox

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "support"))
import evervm_serve  # noqa: E402


Turn = Callable[[list[BaseMessage]], AIMessage]


class ScriptedModel(BaseChatModel):
    """A chat model that plays a script: each call answers with the next turn, a function of the
    messages the agent sent (so a turn can answer from a tool's result). Records what it saw."""

    turns: list[Turn]
    seen: list[list[BaseMessage]] = []

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> "ScriptedModel":
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        if len(self.seen) >= len(self.turns):
            raise AssertionError(f"the agent called the model {len(self.seen) + 1} times, "
                                 f"the script has {len(self.turns)} turns")
        self.seen.append(list(messages))
        message = self.turns[len(self.seen) - 1](list(messages))
        return ChatResult(generations=[ChatGeneration(message=message)])


def call(name: str, **args: Any) -> Turn:
    """A turn that asks for one tool call."""
    def turn(_: list[BaseMessage]) -> AIMessage:
        return AIMessage(content="", tool_calls=[
            {"name": name, "args": args, "id": f"call_{uuid.uuid4().hex[:8]}", "type": "tool_call"}])
    return turn


def answer_from_last_tool(messages: list[BaseMessage]) -> AIMessage:
    """The final turn: states the first line the last tool returned."""
    tool = [m for m in messages if isinstance(m, ToolMessage)][-1]
    first_line = str(tool.content).strip().splitlines()[0]
    return AIMessage(content=f"6 * 7 is {first_line}.")


def tool_results(messages: list[BaseMessage], name: str) -> list[str]:
    return [str(m.content) for m in messages if isinstance(m, ToolMessage) and m.name == name]


def listed(tag: str) -> list[str]:
    """The ids of the sandboxes that E2B's list shows with this test's metadata."""
    paginator = e2b.Sandbox.list(query=e2b.SandboxQuery(metadata={"evervm-test": tag}))
    ids = []
    while paginator.has_next:
        ids += [s.sandbox_id for s in paginator.next_items()]
    return ids


def test_execute_tool_runs_one_agent_step_in_evervm(e2b_server: evervm_serve.Server) -> None:
    """One agent step: the model asks the `execute` tool to run Python, the tool runs it in the
    evervm sandbox through E2B's SDK, and the model's next message answers from its output."""
    tag = uuid.uuid4().hex
    sandbox = e2b.Sandbox.create(timeout=600, metadata={"evervm-test": tag})
    try:
        model = ScriptedModel(turns=[
            call("execute", command="python3 -c 'x = 6 * 7\nprint(x)' | tee answer.txt"),
            answer_from_last_tool,
        ])
        agent = create_deep_agent(model=model, backend=E2BSandbox(sandbox=sandbox))
        result = agent.invoke({"messages": [{"role": "user", "content": "What is 6 * 7?"}]})
        messages = result["messages"]

        [output] = tool_results(messages, "execute")
        assert output.startswith("42\n"), output
        assert "exit code 0" in output, output
        # The model's second turn saw the tool's output and answered from it.
        assert len(model.seen) == 2
        assert tool_results(model.seen[1], "execute") == [output]
        assert isinstance(messages[-1], AIMessage)
        assert messages[-1].content == "6 * 7 is 42."

        # It ran in the evervm sandbox: a new SDK connection to it reads the file the command
        # wrote in the backend's working directory (E2B's home), and E2B's list shows it.
        again = e2b.Sandbox.connect(sandbox.sandbox_id)
        assert again.files.read("/home/user/answer.txt") == "42\n"
        assert again.commands.run("cat answer.txt", cwd="/home/user").stdout == "42\n"
        assert listed(tag) == [sandbox.sandbox_id]
    finally:
        sandbox.kill()
    assert listed(tag) == []


def test_async_agent_writes_and_runs_a_file_in_evervm(e2b_server: evervm_serve.Server) -> None:
    """The async backend (`AsyncSandbox`) in an async run: `write_file` uploads a script with
    `files.write`, `execute` runs it, and the model answers from its output."""
    tag = uuid.uuid4().hex
    path = f"/tmp/evervm-fw-{tag}/answer.py"
    script = "x = 6 * 7\nprint(x)\n"

    async def run() -> tuple[ScriptedModel, list[BaseMessage], str]:
        sandbox = await e2b.AsyncSandbox.create(timeout=600, metadata={"evervm-test": tag})
        try:
            model = ScriptedModel(turns=[
                call("write_file", file_path=path, content=script),
                call("execute", command=f"python3 {path}"),
                answer_from_last_tool,
            ])
            agent = create_deep_agent(model=model, backend=AsyncE2BSandbox(sandbox=sandbox))
            result = await agent.ainvoke(
                {"messages": [{"role": "user", "content": "Write 6 * 7 in Python and run it."}]})
            assert listed(tag) == [sandbox.sandbox_id]
            written = await (await e2b.AsyncSandbox.connect(sandbox.sandbox_id)).files.read(path)
            return model, result["messages"], written
        finally:
            await sandbox.kill()

    model, messages, written = asyncio.run(run())
    [wrote] = tool_results(messages, "write_file")
    assert "Error" not in wrote and path in wrote, wrote
    assert written == script
    [output] = tool_results(messages, "execute")
    assert output.startswith("42\n"), output
    assert len(model.seen) == 3
    assert messages[-1].content == "6 * 7 is 42."
    assert listed(tag) == []


def test_file_tools_in_e2b_home(e2b_server: evervm_serve.Server) -> None:
    """Deep Agents' file tools on a path in E2B's home, the backend's default working directory,
    as an agent on E2B would use them: write the script, read it back, run it by its path."""
    path = "/home/user/answer.py"
    script = "x = 6 * 7\nprint(x)\n"
    sandbox = e2b.Sandbox.create(timeout=600)
    try:
        model = ScriptedModel(turns=[
            call("write_file", file_path=path, content=script),
            call("read_file", file_path=path),
            call("execute", command=f"python3 {path}"),
            answer_from_last_tool,
        ])
        agent = create_deep_agent(model=model, backend=E2BSandbox(sandbox=sandbox))
        messages = agent.invoke(
            {"messages": [{"role": "user", "content": "Write 6 * 7 in Python and run it."}]}
        )["messages"]
        [wrote] = tool_results(messages, "write_file")
        assert "Error" not in wrote and "Traceback" not in wrote, wrote
        [read] = tool_results(messages, "read_file")
        assert "print(x)" in read, read
        [output] = tool_results(messages, "execute")
        assert output.startswith("42\n"), output
    finally:
        sandbox.kill()
