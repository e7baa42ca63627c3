#!/usr/bin/env bash
# The wheels benchmarks/gpu_check.sh carries to the GPU machine, whose image lacks pydantic.
#
#   benchmarks/fetch_wheels.sh [--python-version 3.12] [DEST]     (DEST default: benchmarks/wheels)
#
# Downloads (binary wheels only, no dependencies resolved beyond the list below) pydantic and what it
# imports that the GPU image may lack, for CPython --python-version on x86-64 Linux, into DEST, and
# refuses a set over 16 MiB. DEST is git-ignored: the device tool's `carry` takes it along
# (docs/gpu-benchmarks.md). The versions are the ones raydlc is tested with here.
set -euo pipefail

PY_VERSION=3.12
DEST=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) [ $# -ge 2 ] || { echo "error: --python-version needs a value" >&2; exit 2; }; PY_VERSION="$2"; shift ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "error: unknown option $1" >&2; exit 2 ;;
    *) DEST="$1" ;;
  esac
  shift
done
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${DEST:-$ROOT/benchmarks/wheels}"
WHEELS=(pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0)
MAX_BYTES=$((16 * 1024 * 1024))

mkdir -p "$DEST"
rm -f "$DEST"/*.whl
${PIP:-python3 -m pip} download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DEST" "${WHEELS[@]}"
n="$(ls "$DEST"/*.whl | wc -l)"
bytes="$(cat "$DEST"/*.whl | wc -c)"
[ "$n" = "${#WHEELS[@]}" ] || { echo "error: expected ${#WHEELS[@]} wheels in $DEST, found $n" >&2; exit 1; }
[ "$bytes" -le "$MAX_BYTES" ] || { echo "error: the wheels take $bytes bytes, over 16 MiB" >&2; exit 1; }
echo "$n wheels, $bytes bytes, for CPython $PY_VERSION in $DEST"
