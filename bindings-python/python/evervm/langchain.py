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

from evervm._native import (
    TOOL_CODE_DESCRIPTION,
    TOOL_DESCRIPTION,
    TOOL_NAME,
    Client,
    ExecResult,
    Machine,
)


class PythonCode(BaseModel):
    """The tool's input."""

    code: str = Field(description=TOOL_CODE_DESCRIPTION)


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

    name: str = TOOL_NAME
    description: str = TOOL_DESCRIPTION
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
        content = result.model_text()
        if result.error is not None:
            raise ToolException(content)
        return content, _artifact(result, machine.name)

    async def _arun(self, code: str, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        # The blocking call releases the GIL while it waits: a worker thread keeps the loop free.
        return await asyncio.to_thread(self._run, code, **kwargs)


__all__ = ["EvervmPythonTool", "PythonCode"]
