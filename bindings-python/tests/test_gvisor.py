"""What needs snapshots: swap, fork, checkpoints, undo points (gVisor, over HTTP); rich
output."""

import pytest

import evervm


def test_swap_fork_and_checkpoints(gvisor_server) -> None:  # type: ignore[no-untyped-def]
    client = evervm.Client(gvisor_server.url, gvisor_server.token)
    machine = client.create_machine(tags={"role": "parent"})
    machine.exec("import random\nrandom.seed(1)\nitems = [1]")
    machine.swap_out()
    assert machine.info().state == "swapped"
    assert machine.exec("items").value == "[1]"

    fork = machine.fork(tags={"role": "fork"})
    fork.exec("items.append(2)")
    assert machine.exec("items").value == "[1]"
    assert fork.exec("items").value == "[1, 2]"
    assert fork.info().tags == {"role": "fork"}
    draw = "random.random()"
    assert fork.exec(draw).value != machine.exec(draw).value

    checkpoint = machine.checkpoint("before")
    assert checkpoint.name == "before" and checkpoint.instruction_count > 0
    machine.exec("items.append(3)")
    assert [c.name for c in machine.checkpoints()] == ["before"]
    with pytest.raises(evervm.ConflictError):
        machine.checkpoint("before")
    info = machine.rollback("before")
    assert info.name == machine.name
    assert machine.exec("items").value == "[1]"
    machine.delete_checkpoint("before")
    assert machine.checkpoints() == []


def machine_with_history(client: evervm.Client, history: int) -> evervm.Machine:
    """A machine keeping `history` undo points; the test is skipped, saying why, where the
    server's runsc cannot keep them."""
    try:
        return client.create_machine(image="minimal", history=history)
    except evervm.UnsupportedError as error:
        pytest.skip(f"the server cannot keep undo points here: {error}")


def test_undo_rewind_and_history(gvisor_server) -> None:  # type: ignore[no-untyped-def]
    client = evervm.Client(gvisor_server.url, gvisor_server.token)
    machine = machine_with_history(client, 3)
    info = machine.info()
    assert (info.history, info.parent, info.forked_at) == (3, None, None)
    machine.exec("x = 1")
    machine.exec("x = 2")

    undone = machine.undo()
    assert (undone.to, undone.rewound) == (0, 1)
    assert repr(undone) == "Rewound(to=0, rewound=1)"
    history = machine.history()
    assert (history.keeps, history.initial_point) == (3, True)
    assert [(i.seq, i.code, i.finished, i.rewound) for i in history.instructions] == [
        (0, "x = 1", True, False),
        (1, "x = 2", True, True),
    ]
    assert history.instructions[0].undo_point
    assert [i.seq for i in machine.history(limit=1).instructions] == [1]
    looked = machine.exec("x")
    assert looked.value == "1"

    rewound = machine.rewind(0)
    assert (rewound.to, rewound.rewound) == (0, 1)
    assert machine.exec("x").value == "1"
    assert machine.history().instructions[looked.seq].rewound

    fork = machine.fork()
    assert (fork.info().parent, fork.info().forked_at) == (machine.name, looked.seq + 1)
    fork.delete()

    machine.exec("x = 5")
    early = machine.fork(at=0)  # the state right after instruction 0; the machine is not touched
    assert (early.info().parent, early.info().forked_at) == (machine.name, 0)
    assert early.exec("x").value == "1"
    assert machine.exec("x").value == "5"
    lineage = early.lineage()
    assert lineage.root == machine.name
    assert [(m.name, m.parent, m.forked_at) for m in lineage.machines] == [
        (machine.name, None, None),
        (early.name, machine.name, 0),
    ]
    root = lineage.machines[0]
    assert root.instruction_count == machine.info().instruction_count
    # The undo and the rewind both went back to instruction 0: one run, 1 to 2.
    assert [(t.first, t.last, t.by) for t in root.taken_back] == [(1, 2, "rewind to 0")]
    assert root.checkpoints == [] and lineage.machines[1].taken_back == []
    early.delete()
    machine.delete()


async def test_undo_rewind_and_history_in_asyncio(gvisor_server) -> None:  # type: ignore[no-untyped-def]
    async with evervm.AsyncClient(gvisor_server.url, gvisor_server.token) as client:
        try:
            machine = await client.create_machine(image="minimal", history=3)
        except evervm.UnsupportedError as error:
            pytest.skip(f"the server cannot keep undo points here: {error}")
        assert (await machine.info()).history == 3
        await machine.exec("x = 1")
        await machine.exec("x = 2")
        undone = await machine.undo()
        assert (undone.to, undone.rewound) == (0, 1)
        history = await machine.history()
        assert [(i.seq, i.rewound) for i in history.instructions] == [(0, False), (1, True)]
        assert (await machine.exec("x")).value == "1"
        assert (await machine.rewind(0)).to == 0
        assert (await machine.exec("x")).value == "1"
        await machine.exec("x = 5")
        early = await machine.fork(at=0)
        info = await early.info()
        assert (info.parent, info.forked_at) == (machine.name, 0)
        assert (await early.exec("x")).value == "1"
        lineage = await early.lineage()
        assert lineage.root == machine.name
        assert [(m.name, m.parent, m.forked_at) for m in lineage.machines] == [
            (machine.name, None, None),
            (early.name, machine.name, 0),
        ]
        await early.delete()
        await machine.delete()


def test_a_figure_comes_back_as_data(gvisor_server) -> None:  # type: ignore[no-untyped-def]
    client = evervm.Client(gvisor_server.url, gvisor_server.token)
    machine = client.create_machine(image="data")
    result = machine.exec("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")
    assert result.ok, result.error
    assert isinstance(result.data, dict) and result.data["png"].startswith("iVBOR")


def test_a_dataframe_and_figures_come_back_as_rich_results(gvisor_server) -> None:  # type: ignore[no-untyped-def]
    client = evervm.Client(gvisor_server.url, gvisor_server.token)
    machine = client.create_machine(image="data")
    result = machine.exec(
        "import pandas as pd, matplotlib.pyplot as plt\n"
        "plt.figure(); plt.plot([1, 2])\n"
        "plt.figure(); plt.plot([2, 1])\n"
        "pd.DataFrame({'x': [1, 2]})"
    )
    assert result.ok, result.error
    assert [r.kind for r in result.results] == ["value", "figure", "figure"]
    assert result.results[0].html is not None and "<table" in result.results[0].html
    pngs = [r.png for r in result.results[1:]]
    assert all(p is not None and p.startswith(b"\x89PNG") for p in pngs)
    assert pngs[0] != pngs[1]
    machine.delete()


def test_a_network_policy_is_chosen_at_creation_and_kept(gvisor_server) -> None:  # type: ignore[no-untyped-def]
    client = evervm.Client(gvisor_server.url, gvisor_server.token)
    plain = client.create_machine()
    assert (plain.info().network, plain.info().network_allow) == ("none", [])
    public = client.create_machine(network="public")
    assert public.info().network == "public"
    allow = client.create_machine(network=["PyPI.org.", "*.pythonhosted.org", "198.51.100.0/24"])
    info = allow.info()
    assert info.network == "allow"
    assert info.network_allow == ["pypi.org", "*.pythonhosted.org", "198.51.100.0/24"]
    # Names it may not look up fail as names do.
    assert allow.exec(
        "import socket\ntry:\n    socket.getaddrinfo('example.com', 80)\nexcept OSError as e:\n"
        "    print(type(e).__name__)"
    ).stdout == "gaierror\n"
    allow.swap_out()
    assert allow.info().network_allow == info.network_allow
    for bad in ["open", "allow", ["10.0.0.0/40"], ["2001:db8::/32"], ["bad name.com"], []]:
        with pytest.raises(evervm.InvalidInputError):
            client.create_machine(network=bad)
    for machine in [plain, public, allow]:
        machine.delete()


def test_the_process_backend_refuses_a_network(client: evervm.Client) -> None:
    with pytest.raises(evervm.UnsupportedError):
        client.create_machine(network="public")


def test_a_machine_without_history_refuses_undo(client: evervm.Client) -> None:
    with pytest.raises(evervm.UnsupportedError):
        client.create_machine(history=3)
    machine = client.create_machine()
    machine.exec("x = 1")
    assert machine.info().history == 0
    with pytest.raises(evervm.ConflictError, match="history"):
        machine.undo()
    with pytest.raises(evervm.ConflictError):
        machine.rewind(0)
    machine.delete()
