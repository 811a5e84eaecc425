#!/usr/bin/env python3
"""A server's hot paths as a client over HTTP sees them, for comparing two builds of `evervm
serve` (profiles, say) with the same client: the median and 90th percentile of

- `1+1` on a resident machine (the round trip),
- a first instruction after the machine was swapped out (restore + exec),
- create + first instruction.

Needs the `evervm` Python package (the wheel from dist/) and EVERVM_URL / EVERVM_TOKEN:

    python scripts/server_figures.py [--rounds 500] [--restores 30] [--creates 20]

Prints one JSON line (milliseconds). The machines it makes are deleted at the end.
"""

import argparse
import json
import statistics
import time

import evervm


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered), 3),
        "p90_ms": round(ordered[int(len(ordered) * 0.9) - 1], 3),
        "n": len(ordered),
    }


def timed(action) -> float:
    began = time.perf_counter()
    action()
    return (time.perf_counter() - began) * 1000


def expect(result, value: str) -> None:
    if result.value != value:
        raise SystemExit(f"expected the value {value!r}, got {result.value!r} ({result!r})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--restores", type=int, default=30)
    parser.add_argument("--creates", type=int, default=20)
    args = parser.parse_args()

    client = evervm.Client()
    made = []
    try:
        machine = client.create_machine(tags={"purpose": "server-figures"})
        made.append(machine)
        expect(machine.exec("1+1"), "2")
        for _ in range(20):  # warm up
            machine.exec("1+1")
        round_trip = [timed(lambda: expect(machine.exec("1+1"), "2")) for _ in range(args.rounds)]

        machine.exec("kept = 41")
        restore = []
        for _ in range(args.restores):
            machine.swap_out()
            restore.append(timed(lambda: expect(machine.exec("kept + 1"), "42")))

        create = []
        for _ in range(args.creates):
            began = time.perf_counter()
            fresh = client.create_machine(tags={"purpose": "server-figures"})
            made.append(fresh)
            expect(fresh.exec("1+1"), "2")
            create.append((time.perf_counter() - began) * 1000)
    finally:
        for machine in made:
            try:
                machine.delete()
            except evervm.EvervmError as error:
                print(f"warning: deleting {machine.name}: {error}")
    print(
        json.dumps(
            {
                "exec_1_plus_1": summary(round_trip),
                "restore_and_first_instruction": summary(restore),
                "create_and_first_instruction": summary(create),
            }
        )
    )


if __name__ == "__main__":
    main()
