"""`GET /metrics` of `evervm serve`, read by the Prometheus client library's own OpenMetrics
parser."""

import urllib.request

from prometheus_client.openmetrics.parser import text_string_to_metric_families

import evervm


def test_metrics_parse_and_count(process_server) -> None:  # type: ignore[no-untyped-def]
    client = evervm.Client(process_server.url, process_server.token)
    machine = client.create_machine(tags={"suite": "metrics"})
    assert machine.exec("21 * 2").value == "42"
    machine.files.write("m.bin", b"x" * 1000)
    with urllib.request.urlopen(process_server.url + "/metrics") as answer:
        assert answer.headers["Content-Type"].startswith("application/openmetrics-text")
        text = answer.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in [
        "evervm_instructions",
        "evervm_instruction_duration_seconds",
        "evervm_account_instructions",
        "evervm_restores",
        "evervm_swap_outs",
        "evervm_sandbox_starts",
        "evervm_machines",
        "evervm_account_machines",
        "evervm_snapshot_bytes",
        "evervm_file_bytes",
    ]:
        assert name in families, f"{name} missing from {sorted(families)}"
    assert families["evervm_instruction_duration_seconds"].type == "histogram"
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    assert values[("evervm_instructions_total", (("outcome", "value"),))] >= 1
    assert values[("evervm_file_bytes_total", (("direction", "in"),))] >= 1000
    states = {dict(s.labels)["state"] for s in families["evervm_machines"].samples}
    assert states == {"resident", "swapped", "damaged", "stopped"}
    assert sum(s.value for s in families["evervm_machines"].samples) >= 1
    machine.delete()
