"""Code contexts: more interpreters in one machine, each with its own globals and working
directory, in both transports and the async twin."""

import ast
from pathlib import Path

import pytest

import evervm


def test_contexts_have_their_own_globals_and_working_directory(client: evervm.Client) -> None:
    machine = client.create_machine()
    made = machine.exec("import os, tempfile\nos.path.realpath(tempfile.mkdtemp())")
    cwd = ast.literal_eval(made.value or "")
    ctx = machine.create_context(cwd=cwd)
    assert isinstance(ctx, evervm.Context) and ctx.id != evervm.DEFAULT_CONTEXT and ctx.cwd == cwd
    listed = machine.contexts()
    assert [c.id for c in listed] == [evervm.DEFAULT_CONTEXT, ctx.id]

    # Globals of its own: the default context's `x` is not there.
    assert machine.exec("x = 1").ok
    missing = machine.exec("x", context=ctx)
    assert not missing.ok and missing.exception is not None
    assert missing.exception.name == "NameError"
    assert machine.exec("x", context=evervm.DEFAULT_CONTEXT).value == "1"
    # Its working directory is the one it was made with; a context's id names it too.
    assert machine.exec("import os; os.getcwd()", context=ctx.id).value == repr(cwd)
    assert machine.exec("y = 2", context=ctx).ok
    events = list(machine.stream("print(y)\ny + 1", context=ctx))
    last = events[-1]
    assert isinstance(last, evervm.ExecResult) and (last.stdout, last.value) == ("2\n", "3")

    # Restarted, its variables are gone.
    restarted = machine.restart_context(ctx)
    assert restarted.id == ctx.id and restarted.cwd == cwd
    gone = machine.exec("y", context=ctx)
    assert gone.exception is not None and gone.exception.name == "NameError"

    # Removed, it is not listed, and an instruction for it ends with `ContextNotFound`.
    machine.remove_context(ctx.id)
    assert [c.id for c in machine.contexts()] == [evervm.DEFAULT_CONTEXT]
    after = machine.exec("1", context=ctx)
    assert not after.ok and after.cause == "exception"
    assert after.exception is not None and after.exception.name == "ContextNotFound"
    with pytest.raises(evervm.NotFoundError):
        machine.restart_context(ctx)
    with pytest.raises(evervm.NotFoundError):
        machine.remove_context(ctx.id)
    with pytest.raises(evervm.InvalidInputError):
        machine.remove_context(evervm.DEFAULT_CONTEXT)
    with pytest.raises(TypeError):
        machine.exec("1", context=3)  # type: ignore[arg-type]
    assert machine.exec("x").value == "1", "the machine's own interpreter is untouched"
    machine.delete()


async def test_async_contexts(tmp_path: Path) -> None:
    async with await evervm.AsyncClient.local(home=tmp_path, backend="process", pool_size=0) as c:
        machine = await c.create_machine()
        ctx = await machine.create_context()
        assert [x.id for x in await machine.contexts()] == [evervm.DEFAULT_CONTEXT, ctx.id]
        assert (await machine.exec("z = 5", context=ctx)).ok
        events = [e async for e in machine.stream("z * 2", context=ctx.id)]
        assert isinstance(events[-1], evervm.ExecResult) and events[-1].value == "10"
        missing = await machine.exec("z")
        assert missing.exception is not None and missing.exception.name == "NameError"
        assert (await machine.restart_context(ctx.id)).id == ctx.id
        await machine.remove_context(ctx)
        gone = await machine.exec("z", context=ctx)
        assert gone.exception is not None and gone.exception.name == "ContextNotFound"
        await machine.delete()
