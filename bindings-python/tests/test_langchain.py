"""The LangChain tool in a real tool-calling loop, driven by a scripted chat model (no network)."""

from typing import Any, Optional

import pytest

pytest.importorskip("langchain_core")

from langchain_core.callbacks import CallbackManagerForLLMRun  # noqa: E402
from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402

import evervm  # noqa: E402
from evervm.langchain import EvervmPythonTool  # noqa: E402


class ScriptedModel(BaseChatModel):
    """Asks for two tool calls (the second uses a variable the first defined), then answers
    with what the last tool call returned."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> "ScriptedModel":
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: Optional[list[str]] = None,
        run_manager: Optional[CallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> ChatResult:
        tool_results = [m for m in messages if isinstance(m, ToolMessage)]
        if len(tool_results) == 0:
            call = {"name": "python_repl", "args": {"code": "total = sum(range(10))"}, "id": "c1"}
            reply = AIMessage(content="", tool_calls=[call])
        elif len(tool_results) == 1:
            call = {"name": "python_repl", "args": {"code": "print('half'); total * 2"}, "id": "c2"}
            reply = AIMessage(content="", tool_calls=[call])
        else:
            reply = AIMessage(content=f"The answer is {tool_results[-1].content}")
        return ChatResult(generations=[ChatGeneration(message=reply)])


def run_agent(model: BaseChatModel, tool: EvervmPythonTool, question: str) -> list[BaseMessage]:
    """The tool-calling loop: the model speaks, its tool calls run, until it answers."""
    messages: list[BaseMessage] = [HumanMessage(question)]
    bound = model.bind_tools([tool])
    for _ in range(5):
        reply = bound.invoke(messages)
        messages.append(reply)
        if not isinstance(reply, AIMessage) or not reply.tool_calls:
            return messages
        for call in reply.tool_calls:
            messages.append(tool.invoke({**call, "type": "tool_call"}))
    raise AssertionError("the agent did not finish")


def test_an_agent_uses_state_across_tool_calls(client: evervm.Client) -> None:
    tool = EvervmPythonTool(client=client, tags={"agent": "test"})
    messages = run_agent(ScriptedModel(), tool, "What is twice the sum of 0..9?")
    final = messages[-1]
    assert isinstance(final, AIMessage) and "90" in str(final.content), final
    second = [m for m in messages if isinstance(m, ToolMessage)][-1]
    assert second.content == "half\n90"
    assert second.artifact["value"] == "90" and second.artifact["stdout"] == "half\n"
    assert client.list_machines(tags={"agent": "test"})[0].name == tool.machine.name


def test_errors_reach_the_model_as_tool_errors(client: evervm.Client) -> None:
    tool = EvervmPythonTool(client=client)
    message = tool.invoke(
        {"name": "python_repl", "args": {"code": "1 / 0"}, "id": "e1", "type": "tool_call"}
    )
    assert isinstance(message, ToolMessage)
    assert message.status == "error" and "ZeroDivisionError" in str(message.content)


async def test_the_tool_runs_in_asyncio(client: evervm.Client) -> None:
    tool = EvervmPythonTool(client=client)
    await tool.ainvoke({"name": "python_repl", "args": {"code": "a = 5"}, "id": "a1", "type": "tool_call"})
    message = await tool.ainvoke(
        {"name": "python_repl", "args": {"code": "a + 1"}, "id": "a2", "type": "tool_call"}
    )
    assert message.content == "6"
