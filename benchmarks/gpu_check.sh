#!/usr/bin/env bash
# One prepared check for a machine with a GPU (one H100/H200-class GPU: under 8 minutes).
#
#   benchmarks/gpu_check.sh [--dry-run] [--gpu KEY] [--python PY] [OUTDIR]
#
# 1. nvidia-smi; 2. the efficiency benchmark (benchmarks/gpu_efficiency.py: raydlc's step vs the
# reference loop, MFU); 3. a 1-GPU `python -m raydlc.train` of qwen2.5-0.5b in bf16 on NCCL with
# gradient accumulation; 4. the planner's prediction for that same run beside its measured step
# time; 5. a 7B-shaped memory check (benchmarks/memory_7b.py: Qwen2.5-7B's width and vocabulary,
# 4 layers, seq 2048, checkpointing + chunked loss + bf16 reduction, then unchunked): measured peak
# beside the planner's terms, in OUTDIR/memory_7b.json. Every figure lands under OUTDIR (default ./gpu-check-<UTC time>), and a final table is
# printed (OUTDIR/summary.txt, summary.json).
#
# It installs nothing and needs no network: it runs the repository's own code (PYTHONPATH=src)
# with an existing Python that has torch, ray and transformers (--python, or $PYTHON, else
# python3). --dry-run does only what needs no GPU: the arguments, the planner's prediction and
# the commands it would run (OUTDIR/commands.sh). --gpu names the GPU for the planner (a key of
# raydlc.catalog.GPUS: h100, h200, ...); default: from nvidia-smi (h100 in a dry run).
set -euo pipefail

MODEL=qwen2.5-0.5b
SEQ_LEN=1024
MICRO_BATCH=8
GRAD_ACCUM=4
STEPS=30
REPORT_EVERY=5
EFFICIENCY_ARGS=(--model qwen2.5-1.5b --variants compile --max-seq 2048 --max-batch 16 --steps 20 --warmup 3)
EFFICIENCY_TIMEOUT_S=300
TRAIN_TIMEOUT_S=180
MEMORY_ARGS=(--model qwen2.5-7b --layers 4 --seq-len 2048)
MEMORY_TIMEOUT_S=180

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
fail() { echo "error: $1" >&2; [ $# -gt 1 ] && echo "  hint: $2" >&2; exit "${3:-2}"; }

DRY_RUN=0
GPU=""
PY="${PYTHON:-python3}"
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --gpu) [ $# -ge 2 ] || fail "--gpu needs a value" "e.g. --gpu h100"; GPU="$2"; shift ;;
    --gpu=*) GPU="${1#--gpu=}" ;;
    --python) [ $# -ge 2 ] || fail "--python needs a value" "e.g. --python /usr/bin/python3.12"; PY="$2"; shift ;;
    --python=*) PY="${1#--python=}" ;;
    -h|--help) usage; exit 0 ;;
    -*) fail "unknown option $1" "see $0 --help" ;;
    *) [ -z "$OUT" ] || fail "one OUTDIR only, got '$OUT' and '$1'" "see $0 --help"; OUT="$1" ;;
  esac
  shift
done

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
command -v "$PY" >/dev/null 2>&1 || fail "no Python at '$PY'" "pass --python PATH (a Python with torch, ray and transformers)"
OUT="${OUT:-gpu-check-$(date -u +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT" 2>/dev/null || fail "cannot create OUTDIR $OUT" "pass a writable directory"
OUT="$(cd "$OUT" && pwd)"
[ -w "$OUT" ] || fail "OUTDIR $OUT is not writable" "pass a writable directory"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false TRANSFORMERS_VERBOSITY=error
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
cd "$ROOT"

"$PY" -c "import raydlc.plan" 2>/dev/null || fail "'$PY' cannot import raydlc's dependencies (pydantic, typer, rich, PyYAML)" "use the Python the image ships with torch and ray, via --python"
if [ "$DRY_RUN" = 0 ]; then
  "$PY" -c "import torch, ray, transformers; assert torch.cuda.is_available(), 'no CUDA GPU visible to torch'" \
    || fail "'$PY' lacks torch/ray/transformers or sees no CUDA GPU" "run on the GPU machine with its Python, or use --dry-run" 1
  nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || fail "nvidia-smi failed (see $OUT/nvidia-smi.txt)" "check the driver" 1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/nvidia-smi.csv" 2>/dev/null || true
fi
if [ -z "$GPU" ]; then
  if [ "$DRY_RUN" = 1 ]; then
    GPU=h100
    echo "dry run: planning for an H100 (pass --gpu to choose)"
  else
    NAME="$(head -1 "$OUT/nvidia-smi.csv" | cut -d, -f1)"
    GPU="$("$PY" -c "import sys; from raydlc.catalog import GPUS, gpu_for_device_name as g; m = g(sys.argv[1]); print(next((k for k, v in GPUS.items() if v is m), ''))" "$NAME")"
    [ -n "$GPU" ] || fail "GPU '$NAME' is not in raydlc's catalog" "pass --gpu with one of the keys of raydlc.catalog.GPUS" 1
  fi
fi
"$PY" -c "import sys; from raydlc.catalog import GPUS; sys.exit(sys.argv[1] not in GPUS)" "$GPU" \
  || fail "unknown GPU '$GPU'" "pass --gpu with one of: $("$PY" -c "from raydlc.catalog import GPUS; print(', '.join(GPUS))")"

TRAIN=("$PY" -m raydlc.train --local --model "$MODEL" --workers 1 --steps "$STEPS" --seq-len "$SEQ_LEN" --batch-size "$MICRO_BATCH"
       --grad-accum "$GRAD_ACCUM" --bf16 --out "$OUT/train"
       --set USE_GPU=true --set CHECKPOINT_EVERY=0 --set REPORT_EVERY="$REPORT_EVERY" --set LEARNING_RATE=2e-5 --set WARMUP_STEPS=5)
EFFICIENCY=("$PY" benchmarks/gpu_efficiency.py "${EFFICIENCY_ARGS[@]}" --out "$OUT/efficiency.json")
MEMORY=("$PY" benchmarks/memory_7b.py "${MEMORY_ARGS[@]}" --out "$OUT/memory_7b.json")
{
  echo "# benchmarks/gpu_check.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ), GPU '$GPU'; run from $ROOT with PYTHONPATH=$PYTHONPATH"
  echo "nvidia-smi > $OUT/nvidia-smi.txt"
  echo "timeout $EFFICIENCY_TIMEOUT_S ${EFFICIENCY[*]}"
  echo "timeout $TRAIN_TIMEOUT_S ${TRAIN[*]}"
  echo "timeout $MEMORY_TIMEOUT_S ${MEMORY[*]}"
} > "$OUT/commands.sh"

echo "== planner: $MODEL, micro-batch $MICRO_BATCH x $GRAD_ACCUM accumulated, seq $SEQ_LEN, 1 x $GPU"
"$PY" benchmarks/gpu_check_report.py predict --out "$OUT" --gpu "$GPU" --model "$MODEL" --seq-len "$SEQ_LEN" \
  --micro-batch "$MICRO_BATCH" --grad-accum "$GRAD_ACCUM"

echo "== planner: 7B-shaped memory check (${MEMORY_ARGS[*]})"
"${MEMORY[@]}" --plan-only | sed '$d'

if [ "$DRY_RUN" = 1 ]; then
  echo "== dry run: the commands it would run (also in $OUT/commands.sh)"
  sed -n '2,$p' "$OUT/commands.sh"
  echo "== table"
  "$PY" benchmarks/gpu_check_report.py table --out "$OUT" --dry-run
  exit 0
fi

STATUS=0
phase() {  # name, timeout, command...: output to OUTDIR/<name>.txt, the time it took on the screen
  local name="$1" limit="$2"; shift 2
  local t0=$SECONDS
  echo "== $name (at most ${limit}s)"
  if timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1; then
    echo "   done in $((SECONDS - t0))s: $(tail -1 "$OUT/$name.txt")"
  else
    echo "   FAILED after $((SECONDS - t0))s (exit $?); last lines of $OUT/$name.txt:"; tail -5 "$OUT/$name.txt" | sed 's/^/   /'
    STATUS=1
  fi
}
phase efficiency "$EFFICIENCY_TIMEOUT_S" "${EFFICIENCY[@]}"
phase train "$TRAIN_TIMEOUT_S" "${TRAIN[@]}"
phase memory_7b "$MEMORY_TIMEOUT_S" "${MEMORY[@]}"
grep -E '^\{' "$OUT/train.txt" | tail -1 > "$OUT/train.json" || true
echo "== table"
"$PY" benchmarks/gpu_check_report.py table --out "$OUT" || STATUS=1
exit "$STATUS"
