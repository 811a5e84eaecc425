"""What needs snapshots: swap, fork, checkpoints (gVisor, over HTTP); rich output."""

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
