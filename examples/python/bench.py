"""`1+1` round trips through the Python package, in-process (compare with the Rust client's line
`exec 1+1 round trip, in-process` of `cargo run --release -p evervm-examples --bin bench`).

    python examples/python/bench.py [--backend process|gvisor] [--rounds 300]
"""

import argparse
import asyncio
import tempfile
import time

import evervm


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[round(p / 100 * (len(ordered) - 1))]


def report(label: str, samples: list[float]) -> None:
    print(f"  {label:<44} p50 {percentile(samples, 50) * 1e3:7.2f} ms  "
          f"p99 {percentile(samples, 99) * 1e3:7.2f} ms  (n={len(samples)})")


async def async_rounds(home: str, backend: str, rounds: int) -> list[float]:
    client = await evervm.AsyncClient.local(home=home, backend=backend, pool_size=0)
    machine = await client.create_machine()
    await machine.exec("1")
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await machine.exec("1+1")
        samples.append(time.perf_counter() - started)
    await client.close()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="process")
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    print(f"evervm Python bench: backend {args.backend}, {args.rounds} rounds")
    with tempfile.TemporaryDirectory() as home:
        with evervm.Client.local(home=home, backend=args.backend, pool_size=0) as client:
            machine = client.create_machine()
            machine.exec("1")
            samples = []
            for _ in range(args.rounds):
                started = time.perf_counter()
                machine.exec("1+1")
                samples.append(time.perf_counter() - started)
            report("exec 1+1 round trip, Python, in-process", samples)
    with tempfile.TemporaryDirectory() as home:
        report("exec 1+1 round trip, Python asyncio, in-process",
               asyncio.run(async_rounds(home, args.backend, args.rounds)))


if __name__ == "__main__":
    main()
