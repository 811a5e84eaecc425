#!/usr/bin/env python3
"""Runs the code blocks of the README and the book that are marked runnable, so that the docs
cannot rot: a fenced block whose previous line is `<!-- runnable -->` (invisible on GitHub and in
the book) runs against a fresh `evervm serve` on gVisor, with EVERVM_URL, EVERVM_TOKEN and the
`evervm` command set up as the README tells a reader to. `sh` blocks run in bash (`-euo
pipefail`), `python` blocks in PYTHON (an interpreter with the evervm package), `js` blocks as
ES modules inside bindings-node (so `import ... from 'evervm'` finds the package). A block that
exits non-zero fails the run; so does finding none.

    python3 scripts/run_doc_blocks.py --evervm PATH --python PATH [FILE...]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))
import evervm_serve  # noqa: E402

MARK = "<!-- runnable -->"
FENCE = re.compile(r"^(```|~~~)\s*([A-Za-z0-9_+-]*)")
# How long one block may take (a first machine on a fresh home builds its base snapshot).
BLOCK_TIMEOUT_S = 180


def runnable_blocks(path: Path) -> list[tuple[int, str, str]]:
    """(line of the fence, language, code) of each block marked runnable in `path`."""
    blocks = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start, marker, language = i, fence.group(1), fence.group(2)
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith(marker):
            body.append(lines[i])
            i += 1
        i += 1
        previous = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        if previous.strip() == MARK:
            blocks.append((start + 1, language, "\n".join(body) + "\n"))
    return blocks


def run_block(language: str, code: str, env: dict[str, str], python: str) -> subprocess.CompletedProcess:
    if language in ("sh", "bash", "shell"):
        command, cwd = ["bash", "-euo", "pipefail", "-c", code], REPO
    elif language == "python":
        command, cwd = [python, "-c", code], REPO
    elif language in ("js", "mjs"):
        script = REPO / "bindings-node" / f".doc-block-{os.getpid()}.mjs"
        script.write_text(code)
        command, cwd = ["node", script.name], script.parent
    else:
        raise ValueError(f"a runnable block in {language!r}: only sh, python and js run")
    try:
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL,
                              timeout=BLOCK_TIMEOUT_S, check=False)
    finally:
        if language in ("js", "mjs"):
            script.unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--evervm", required=True, type=Path, help="the evervm binary")
    parser.add_argument("--python", required=True, help="a Python with the evervm package")
    parser.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args()
    files = [f.resolve() for f in args.files] or [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    blocks = [(f, *b) for f in files for b in runnable_blocks(f)]
    if not blocks:
        print(f"no block marked {MARK} in {', '.join(map(str, files))}", file=sys.stderr)
        return 1
    os.environ["EVERVM_BIN"] = str(args.evervm.resolve())
    server = evervm_serve.Server("gvisor", "evervm-docs-")
    env = {**os.environ, "EVERVM_URL": server.url, "EVERVM_TOKEN": server.token,
           "PATH": f"{args.evervm.resolve().parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    failed = 0
    try:
        for path, line, language, code in blocks:
            where = f"{path.relative_to(REPO)}:{line}"
            try:
                done = run_block(language, code, env, args.python)
            except subprocess.TimeoutExpired:
                print(f"FAILED  {where} ({language}): still running after {BLOCK_TIMEOUT_S} s")
                failed += 1
                continue
            if done.returncode == 0:
                print(f"ok      {where} ({language})")
            else:
                failed += 1
                print(f"FAILED  {where} ({language}): exit {done.returncode}\n"
                      f"{done.stdout}{done.stderr}")
    finally:
        server.stop()
    print(f"{len(blocks) - failed} of {len(blocks)} runnable blocks ran")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
