#!/usr/bin/env bash
# The GPU run of issue #30 on an offline GPU host, from the repository root, after the gpu-bundle
# parts (../shared/tools/gpu-bundle/pack.sh, with EXTRA_WHEELS="fastapi uvicorn" for the serve
# rows) were copied into one folder. Every step prints what it runs; results go to $OUT.
#
#   BUNDLE=/path/to/parts OUT=/path/to/results bash bench/gpu/run.sh
#
# BUNDLE   the folder holding the parts, their files side by side or in part1/ ... partN/
#          subfolders (default .gpu); unpacked here if BUNDLE/site is missing
# OUT      where gpu_bench.json, the logs and nvidia-smi's report are copied (default
#          bench/results)
# DATA     a BEIR folder (default: the first of shared/data/scifact, ../shared/data/scifact,
#          $CROSSKNN_DATA/scifact, else scifact/ of BUNDLE/data/beir.tar.xz extracted to /tmp;
#          without one the bench records the error and stops)
# SECTIONS the bench's sections (default all: ce,torch,search,serve)
# SERVE_VARIANTS  the serve section's servers (gpu_bench.py --serve-variants)
# GPU_BENCH_EXTRA  more gpu_bench.py options (e.g. --py-spy)
# MAX_SECONDS  the bench's global deadline (default 270); the export of the embedded models
#          (first use, about a minute) and the install happen before it starts
set -uo pipefail
BUNDLE=$(cd "${BUNDLE:-.gpu}" && pwd) || { echo "! set BUNDLE to the folder with the gpu-bundle parts" >&2; exit 2; }
OUT=${OUT:-bench/results}
MAX_SECONDS=${MAX_SECONDS:-270}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/gpu-bench-XXXXXX)
SETUP=""
run() {  # print, record, run; a failing step is reported and the run goes on
  echo "+ $*" >&2
  SETUP+="$*"$'\n'
  "$@"
  local rc=$?
  [ $rc -eq 0 ] || echo "! exit $rc: $*" >&2
  return $rc
}

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || echo "! nvidia-smi failed (no GPU?)" >&2
S=$BUNDLE
if [ ! -d "$S/site" ] && [ ! -f "$S/unpack.sh" ] && ls -d "$S"/part*/ >/dev/null 2>&1; then
  S=$BUNDLE/all  # unpack.sh wants every part's files in one folder
  if [ ! -d "$S/site" ]; then
    run mkdir -p "$S" && { cp -ln "$BUNDLE"/part*/* "$S"/ 2>/dev/null || run cp -n "$BUNDLE"/part*/* "$S"/; }
  fi
fi
[ -d "$S/site" ] || run bash "$S/unpack.sh" "$S" || exit 1
export PYTHONPATH="$S/site${PYTHONPATH:+:$PYTHONPATH}"
SETUP+="export PYTHONPATH=$PYTHONPATH"$'\n'

# onnxruntime-gpu from the bundle, its CUDA provider visible
run "$PY" -c "import torch, onnxruntime as ort; ort.preload_dlls(); print('onnxruntime', ort.__version__, ort.get_available_providers(), 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"

# crossknn from this checkout (non-editable); reinstalled when the installed one is older
if ! (cd /tmp && "$PY" -c "import crossknn._core, crossknn.ce.feeds, crossknn.ce.folders as f; assert 'fp16' in f.RUN_PRECISIONS") 2>/dev/null; then
  run "$PY" -m pip install --no-build-isolation --no-deps -q . || exit 1
fi
run "$PY" -c "import crossknn, fastapi, uvicorn; print('crossknn', crossknn.__file__, 'serve deps ok')" \
  || echo "! fastapi/uvicorn missing: the serve rows will be skipped" >&2

# the embedded CE and DE exported into the cache on first use (torch + transformers + onnx)
export CROSSKNN_CACHE=${CROSSKNN_CACHE:-$HOME/.cache/crossknn}
run "$PY" -c "import time; t=time.time(); from crossknn.ce import ensure_model; print(ensure_model('minilm-l6-joint')); print(ensure_model('minilm-l6-de')); print(f'export {time.time()-t:.0f} s')"

if [ -z "${DATA:-}" ]; then
  for d in shared/data/scifact ../shared/data/scifact "${CROSSKNN_DATA:-/nonexistent}/scifact"; do
    if [ -f "$d/corpus.jsonl" ]; then DATA=$d; break; fi
  done
fi
if [ -z "${DATA:-}" ] && [ -f "$BUNDLE/data/beir.tar.xz" ]; then
  run mkdir -p /tmp/gpu-data && run tar -C /tmp/gpu-data -xJf "$BUNDLE/data/beir.tar.xz" scifact \
    && DATA=/tmp/gpu-data/scifact
fi
echo "data: ${DATA:-none found}" >&2

export GPU_BENCH_SETUP="$SETUP"
run timeout $((MAX_SECONDS + 60)) "$PY" bench/gpu_bench.py --max-seconds "$MAX_SECONDS" \
  --data "${DATA:-shared/data/scifact}" --out "$OUT/gpu_bench.json" --work "$WORK" \
  ${SECTIONS:+--sections "$SECTIONS"} ${SERVE_VARIANTS:+--serve-variants "$SERVE_VARIANTS"} \
  ${GPU_BENCH_EXTRA:-}
rc=$?
cp "$WORK"/*.log "$OUT"/ 2>/dev/null || true
echo "results in $OUT (bench exit $rc)" >&2
exit $rc
