"""A LangChain agent with a persistent Python tool: `pip install "./bindings-python[langchain]"`.

The chat model here is scripted so that the example runs offline; with a real one, pass e.g.
`ChatOpenAI(model=...)` or `ChatAnthropic(model=...)` to `run_agent` instead: the loop and the
tool stay the same.
"""

from typing import Any, Optional

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult

import evervm
from evervm.langchain import EvervmPythonTool


class ScriptedModel(BaseChatModel):
    """Plays the model: defines data, computes with it, then reports the tool's answer."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> "ScriptedModel":
        return self

    def _generate(self, messages: list[BaseMessage], stop: Optional[list[str]] = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        done = [m for m in messages if isinstance(m, ToolMessage)]
        script = ["prices = {'apple': 1.25, 'pear': 0.8, 'fig': 2.5}",
                  "round(sum(prices.values()) / len(prices), 2)"]
        if len(done) < len(script):
            call = {"name": "python_repl", "args": {"code": script[len(done)]}, "id": f"call{len(done)}"}
            reply = AIMessage(content="", tool_calls=[call])
        else:
            reply = AIMessage(content=f"The average price is {done[-1].content}.")
        return ChatResult(generations=[ChatGeneration(message=reply)])


def run_agent(model: BaseChatModel, tool: EvervmPythonTool, question: str) -> str:
    """The tool-calling loop: the model speaks, its tool calls run, until it answers."""
    messages: list[BaseMessage] = [HumanMessage(question)]
    bound = model.bind_tools([tool])
    while True:
        reply = bound.invoke(messages)
        messages.append(reply)
        if not isinstance(reply, AIMessage) or not reply.tool_calls:
            return str(reply.content)
        for call in reply.tool_calls:
            messages.append(tool.invoke({**call, "type": "tool_call"}))


if __name__ == "__main__":
    with evervm.Client.local() as client:
        tool = EvervmPythonTool(client=client, tags={"example": "langchain"})
        print(run_agent(ScriptedModel(), tool, "What is the average fruit price?"))
        tool.machine.delete()
