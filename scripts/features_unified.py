#!/usr/bin/env python3
"""Fails when building a binding package on its own would compile shared crates again.

scripts/test.sh builds the whole workspace once (its tests, their dev-dependencies and the
Python and Node modules together); maturin and napi then build one package each. Cargo unifies a
crate's features over the packages one command builds, so any crate that the workspace build
gives more features than the package's own build does is compiled twice, and everything that
depends on it (tokio, the engine) with it. workspace-hack/Cargo.toml lists those features for
the bindings; this check compares the two resolutions with `cargo tree` (no build) and names
what to add there.

    python3 scripts/features_unified.py evervm-python evervm-node
"""

from __future__ import annotations

import subprocess
import sys

# What scripts/test.sh's build selects.
WORKSPACE = ["--workspace", "--exclude", "evervm-swift"]


def features(selection: list[str], edges: str) -> dict[str, set[str]]:
    """Each package's features ("name vX.Y.Z (source)" -> features) in that selection."""
    out = subprocess.run(
        ["cargo", "tree", "--locked", *selection, "-e", edges, "-f", "{p}|{f}", "--prefix", "none"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found: dict[str, set[str]] = {}
    for line in out.splitlines():
        line = line.strip().removesuffix(" (*)")
        if "|" not in line:
            continue
        package, listed = line.split("|", 1)
        found.setdefault(package, set()).update(f for f in listed.split(",") if f)
    return found


def main() -> int:
    packages = sys.argv[1:]
    if not packages:
        print(__doc__, file=sys.stderr)
        return 2
    workspace = features(WORKSPACE, "normal,build,dev")
    drift = []
    for package in packages:
        alone = features(["-p", package], "normal,build")
        for crate, wanted in sorted(alone.items()):
            missing = workspace.get(crate, wanted) - wanted
            if missing:
                drift.append(f"  {crate}: {', '.join(sorted(missing))} (building {package} alone)")
    if drift:
        print(
            "These crates get more features in the workspace's build than in a binding's own, so\n"
            "maturin or napi would compile them (and all that depends on them) a second time:\n"
            + "\n".join(drift)
            + "\nAdd those features to workspace-hack/Cargo.toml.",
            file=sys.stderr,
        )
        return 1
    print(f"features unified: {', '.join(packages)} built alone reuse the workspace's build")
    return 0


if __name__ == "__main__":
    sys.exit(main())
