"""A LangChain tool: a stateful Python REPL on an evervm machine.

    from evervm import Client
    from evervm.langchain import EvervmPythonTool

    tool = EvervmPythonTool(client=Client.local(), tags={"agent": "analyst"})
    model_with_tools = chat_model.bind_tools([tool])

One machine per tool instance, created at the first call: variables, imports and files persist
from one call to the next. The tool answers with the output and the value as content and the
whole result as artifact; an error (a traceback, a timeout) comes back as a tool error the model
can read. Needs `langchain-core` (`pip install "evervm[langchain]"`).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Optional

from langchain_core.tools import BaseTool, ToolException
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from evervm._native import Client, ExecResult, Machine


class PythonCode(BaseModel):
    """The tool's input."""

    code: str = Field(description="Python code to run; the value of its last expression is returned.")


def _content(result: ExecResult) -> str:
    parts = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    if result.error is not None:
        parts.append(result.error.rstrip("\n"))
    elif result.value is not None:
        parts.append(result.value)
    for rich in result.results:
        if rich.kind == "figure":
            parts.append("[a figure: the PNG is in the tool's artifact]")
        elif rich.kind == "display" and rich.text is not None:
            parts.append(rich.text)
    return "\n".join(parts) if parts else "(no output)"


def _artifact(result: ExecResult, machine: str) -> dict[str, Any]:
    return {
        "machine": machine,
        "seq": result.seq,
        "value": result.value,
        "error": result.error,
        "cause": result.cause,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "data": result.data,
        "results": [{"kind": rich.kind, "data": rich.data} for rich in result.results],
        "runtime_ms": result.runtime_ms,
    }


class EvervmPythonTool(BaseTool):
    """A persistent Python REPL in a sandbox (an evervm machine)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str = "python_repl"
    description: str = (
        "Runs Python code in a persistent, sandboxed interpreter. Variables, imports, functions "
        "and files persist between calls. Returns what the code printed and the value of its last "
        "expression. Use print() to see intermediate values."
    )
    args_schema: type[BaseModel] = PythonCode
    response_format: str = "content_and_artifact"
    handle_tool_error: bool = True

    client: Client
    tags: Optional[dict[str, str]] = None
    memory_mb: Optional[int] = None
    image: Optional[str] = None
    timeout: float = 60.0

    _machine: Optional[Machine] = PrivateAttr(default=None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def machine(self) -> Machine:
        """The tool's machine, created at first use."""
        with self._lock:
            if self._machine is None:
                self._machine = self.client.create_machine(
                    tags=self.tags, memory_mb=self.memory_mb, image=self.image
                )
            return self._machine

    def _run(self, code: str, **_: Any) -> tuple[str, dict[str, Any]]:
        machine = self.machine
        result = machine.exec(code, timeout=self.timeout)
        content = _content(result)
        if result.error is not None:
            raise ToolException(content)
        return content, _artifact(result, machine.name)

    async def _arun(self, code: str, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        # The blocking call releases the GIL while it waits: a worker thread keeps the loop free.
        return await asyncio.to_thread(self._run, code, **kwargs)


__all__ = ["EvervmPythonTool", "PythonCode"]
