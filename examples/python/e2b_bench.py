"""`run_code("1+1")` round trips through E2B's Python SDK against `evervm serve --e2b-listen`,
and `exec("1+1")` through evervm's own Python client against the same server, in the same run
(one server, one backend, alternating blocks so that both see the same host).

    pip install ./bindings-python e2b-code-interpreter==2.11.5
    python examples/python/e2b_bench.py [--backend gvisor|process] [--rounds 300]
"""

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "support"))
import evervm_serve  # noqa: E402


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[round(p / 100 * (len(ordered) - 1))]


def report(label: str, samples: list[float]) -> None:
    print(f"  {label:<52} p50 {percentile(samples, 50) * 1e3:7.2f} ms  "
          f"p99 {percentile(samples, 99) * 1e3:7.2f} ms  (n={len(samples)})")


def timed(call, rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="gvisor")
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    server = evervm_serve.Server(args.backend, "evervm-e2b-bench-", e2b=True)
    try:
        os.environ["E2B_API_URL"] = os.environ["E2B_SANDBOX_URL"] = server.e2b_url
        os.environ["E2B_API_KEY"] = server.e2b_key
        import evervm
        from e2b_code_interpreter import Sandbox

        sandbox = Sandbox.create()
        client = evervm.Client(server.url, server.token)
        machine = client.create_machine()
        assert sandbox.run_code("1+1").text == "2"
        assert machine.exec("1+1").value == "2"
        e2b_samples: list[float] = []
        evervm_samples: list[float] = []
        block = max(1, args.rounds // 10)
        for _ in range(0, args.rounds, block):
            e2b_samples += timed(lambda: sandbox.run_code("1+1"), block)
            evervm_samples += timed(lambda: machine.exec("1+1"), block)
        print(f"run_code round trip: backend {args.backend}, "
              f"{len(e2b_samples)} rounds each")
        report("E2B SDK run_code('1+1') via --e2b-listen", e2b_samples)
        report("evervm Python client exec('1+1') via the API", evervm_samples)
        sandbox.kill()
        client.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
