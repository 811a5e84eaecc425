"""How long a new E2B sandbox's first cell takes (it loads IPython into the machine) against
the next one, through evervm's E2B door on gVisor. A benchmark, not a test: it prints figures.

    EVERVM_BIN=target/debug/evervm python tests/e2b/bench_first_cell.py [SANDBOXES]

Needs E2B's Python SDK (tests/e2b's venv) and what evervm_serve needs for gVisor."""

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
import evervm_serve  # noqa: E402


def figures(seconds: list[float]) -> str:
    ms = [s * 1000 for s in seconds]
    return f"min {min(ms):.0f} median {statistics.median(ms):.0f} max {max(ms):.0f} ms"


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    server = evervm_serve.Server("gvisor", "evervm-bench-", e2b=True)
    os.environ.update(
        E2B_API_URL=server.e2b_url, E2B_SANDBOX_URL=server.e2b_url, E2B_API_KEY=server.e2b_key
    )
    from e2b_code_interpreter import Sandbox

    first, second = [], []
    try:
        for _ in range(count):
            sandbox = Sandbox.create()
            sandbox.commands.run("true")  # the machine is running before the clock starts
            started = time.perf_counter()
            sandbox.run_code("1")
            first.append(time.perf_counter() - started)
            started = time.perf_counter()
            sandbox.run_code("1")
            second.append(time.perf_counter() - started)
            sandbox.kill()
    finally:
        server.stop()
    print(f"first cell ({count} sandboxes): {figures(first)}")
    print(f"next cell: {figures(second)}")


if __name__ == "__main__":
    main()
