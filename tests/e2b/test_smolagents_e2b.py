"""A second agent framework's E2B executor, unchanged, against `evervm serve --e2b-listen`:
Hugging Face's smolagents, `CodeAgent(executor_type="e2b")`. Its executor runs each step's code
with E2B's `run_code`, defines its tools in the sandbox, and recognises the final answer by the
name of an exception class its `final_answer` tool raises (`FinalAnswerException`, defined in a
method); so the agent finishes only if the error's name is the exception's class name, as E2B's
code interpreter gives it. The model is scripted (no network, no key); everything else is the
packages' own code, pointed at evervm by E2B's environment variables (conftest's `e2b_server`).

Requirements: tests/e2b/requirements-framework.txt."""

from __future__ import annotations

from typing import Any

from smolagents import CodeAgent
from smolagents.models import ChatMessage, Model

STEPS = [
    # A step whose code fails: the agent is told, and goes on.
    "Thought: start with the numbers.\n<code>\nnumbers = list(range(10))\nprint(numbers[100])\n</code>",
    # State kept between steps, printed output read back.
    "Thought: fix the index.\n<code>\ntotal = sum(numbers)\nprint('total is', total)\n</code>",
    # The final answer, through smolagents' own final_answer tool in the sandbox.
    "Thought: done.\n<code>\nfinal_answer(total * 2)\n</code>",
]


class ScriptedModel(Model):
    """Answers each step with the next of STEPS, and keeps what the agent showed it."""

    def __init__(self) -> None:
        super().__init__(model_id="scripted")
        self.turns: list[list[ChatMessage]] = []

    def generate(self, messages: list[ChatMessage], stop_sequences: Any = None, **_: Any):
        self.turns.append(list(messages))
        step = STEPS[min(len(self.turns), len(STEPS)) - 1]
        return ChatMessage(role="assistant", content=step)


def text_of(messages: list[ChatMessage]) -> str:
    parts = []
    for message in messages:
        content = message.content
        if isinstance(content, list):
            parts += [str(c.get("text", "")) for c in content if isinstance(c, dict)]
        else:
            parts.append(str(content))
    return "\n".join(parts)


def test_code_agent_finishes_on_evervm(e2b_server) -> None:
    model = ScriptedModel()
    agent = CodeAgent(tools=[], model=model, executor_type="e2b", max_steps=6)
    try:
        answer = agent.run("What is twice the sum of 0..9?")
    finally:
        agent.cleanup()
    assert answer == 90
    # It took the three scripted steps, not the step limit.
    assert len(model.turns) == 3
    seen = text_of(model.turns[-1])
    assert "IndexError" in seen and "total is 45" in seen, seen[-2000:]
