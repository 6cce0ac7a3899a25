#!/usr/bin/env bash
# Prints the Python interpreter the build and tests use.
#
# $PYTHON if set; else python3, unless that interpreter is "externally
# managed" (PEP 668, e.g. Debian's /usr/bin/python3), in which case a
# virtual environment .venv beside this repository is created once (with
# access to the system's site-packages) and its interpreter is used.
set -euo pipefail
if [ -n "${PYTHON:-}" ]; then
    command -v "$PYTHON"
    exit 0
fi
py=$(command -v python3)
managed=$("$py" -c 'import os, sysconfig; print(int(os.path.exists(os.path.join(sysconfig.get_paths()["stdlib"], "EXTERNALLY-MANAGED"))))')
if [ "$managed" = 0 ]; then
    echo "$py"
    exit 0
fi
root=$(cd "$(dirname "$0")/.." && pwd)
if [ ! -x "$root/.venv/bin/python" ]; then
    if ! "$py" -c 'import ensurepip' 2>/dev/null; then
        echo "tools/python.sh: installing python3-venv" >&2
        if [ "$(id -u)" = 0 ]; then apt-get install -y -qq python3-venv >/dev/null; else sudo apt-get install -y -qq python3-venv >/dev/null; fi
    fi
    "$py" -m venv --system-site-packages "$root/.venv" >&2
fi
echo "$root/.venv/bin/python"
