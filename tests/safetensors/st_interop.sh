#!/bin/sh
# tests/safetensors/st_interop.sh TOOL: run st_interop.py with Debian's /usr/bin/python3
# (numpy/torch optional); skip (exit 77) when that interpreter is absent.
PY=/usr/bin/python3
if [ ! -x "$PY" ]; then
    echo "skipped: $PY not found"
    exit 77
fi
exec "$PY" "$(dirname "$0")/st_interop.py" "$1"
