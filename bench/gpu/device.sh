#!/usr/bin/env bash
# The last call of a staged run on a lent GPU host (docs/ce.md, "On a lent device"): every
# gpu-bundle part is in /tmp/stage (its data/ folder holds beir.tar.xz), this checkout in /tmp/src
# (its pip install started in the first call, logging to /tmp/pip.log). Waits for the install,
# then runs bench/gpu/run.sh; what it keeps lands in $OUT.
#
#   SECTIONS=search,serve SERVE_VARIANTS=default,group1+any MAX_SECONDS=170 bash bench/gpu/device.sh
#
# GPU_BENCH_EXTRA: more gpu_bench.py options (e.g. "--serve-requests 200").
#
# PY_SPY=1 with a py-spy wheel in /tmp/stage/data: py-spy dumps of each server under load.
set -u
cd /tmp/src || exit 2
echo "== waiting for the install ($(date +%T))"
for _ in $(seq 1 150); do grep -q '^rc=' /tmp/pip.log 2>/dev/null && break; sleep 2; done
tail -2 /tmp/pip.log
EXTRA=()
if [ "${PY_SPY:-0}" = 1 ] && ls /tmp/stage/data/py_spy-*.whl >/dev/null 2>&1; then
  mkdir -p /tmp/pyspy && (cd /tmp/pyspy && python3 -m zipfile -e /tmp/stage/data/py_spy-*.whl .)
  chmod +x /tmp/pyspy/py_spy-*.data/scripts/py-spy
  PATH="$(ls -d /tmp/pyspy/py_spy-*.data/scripts):$PATH"
  export PATH
  EXTRA=(--py-spy)
fi
export GPU_BENCH_EXTRA="${GPU_BENCH_EXTRA:-} ${EXTRA[*]:-}"
BUNDLE=/tmp/stage OUT=${OUT:?set OUT} MAX_SECONDS=${MAX_SECONDS:-270} \
  timeout $((${MAX_SECONDS:-270} + 200)) bash bench/gpu/run.sh
echo "== gpu/run.sh exit $? ($(date +%T))"
