#!/usr/bin/env bash
# Put NVIDIA's perf_analyzer on the PATH of the current Python environment (README "Set up").
#
# perf_analyzer ships as a binary inside the tritonclient==2.46.0 wheel (the newest wheel that
# still has it; triton-mp's own tritonclient stays as pip resolved it) and links to
# libcudart.so.12 (from the nvidia-cuda-runtime-cu12 wheel; no GPU is needed to run it) and
# libb64.so.0d (Debian's libb64-0d, which the README's apt-get line installs). Both wheels are
# unpacked into DIR (default ./.peers, shared with bench/peers/install-peers.sh, which skips
# what is there), and a two-line wrapper `perf_analyzer` that sets LD_LIBRARY_PATH is written
# into the environment's scripts folder (the venv's bin/). Safe to run again.
# Usage: bash scripts/install-perf-analyzer.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

TRITONCLIENT=tritonclient==2.46.0             # same pins as bench/peers/install-peers.sh
CUDART=nvidia-cuda-runtime-cu12==12.9.79
PY=${PYTHON:-python}

mkdir -p "${1:-.peers}"
DEST=$(cd "${1:-.peers}" && pwd)

# Read ldconfig's whole list before matching: `grep -q` stops at the first match, ldconfig then
# dies of SIGPIPE on a machine whose list passes the pipe's 64 KiB, and pipefail reports that as
# "missing" (a clean CI machine with the README's apt packages did exactly this). ldconfig is in
# /sbin, off a non-root PATH; Debian's multiarch folders are looked at as well.
LIBS=$( (ldconfig -p || /sbin/ldconfig -p) 2>/dev/null || true)
if ! grep -q 'libb64\.so\.0d' <<<"$LIBS" \
    && ! compgen -G '/usr/lib/*/libb64.so.0d' >/dev/null && ! compgen -G '/lib/*/libb64.so.0d' >/dev/null; then
  echo "install-perf-analyzer: libb64.so.0d is missing: apt-get install -y libb64-0d" >&2
  exit 1
fi

unpack_wheel() {  # unpack_wheel SPEC FOLDER [pip download options...]; a marker skips a rerun
  local spec=$1 dir=$DEST/$2; shift 2
  [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$spec" ] && return 0
  local tmp; tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps --only-binary=:all: --dest "$tmp" "$@" "$spec"
  rm -rf "$dir" && mkdir -p "$dir"
  "$PY" -m zipfile -e "$tmp"/*.whl "$dir"
  rm -rf "$tmp"
  echo "$spec" >"$dir/.installed"
}

unpack_wheel "$TRITONCLIENT" perf_analyzer --platform manylinux1_x86_64
unpack_wheel "$CUDART" cudart

PA=$DEST/perf_analyzer/${TRITONCLIENT/==/-}.data/data/bin/perf_analyzer
CUDART_LIB=$DEST/cudart/nvidia/cuda_runtime/lib
chmod +x "$PA"   # unzipping drops the executable bit

BIN=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
cat >"$BIN/perf_analyzer" <<EOF
#!/bin/sh
# Written by triton-mp's scripts/install-perf-analyzer.sh: NVIDIA's perf_analyzer 2.46.0.
LD_LIBRARY_PATH=$CUDART_LIB\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} exec "$PA" "\$@"
EOF
chmod +x "$BIN/perf_analyzer"
"$BIN/perf_analyzer" --version
echo "perf_analyzer: $BIN/perf_analyzer"
