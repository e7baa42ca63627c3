#!/usr/bin/env bash
# One prepared check for the GPU machine (one H100 80 GB or one H200; its own image: torch, transformers; no ray, no pydantic).
#
#   benchmarks/gpu_check.sh [--dry-run] [--gpu KEY] [--python PY] [--wheels DIR] OUTDIR
#
# Runs benchmarks/gpu_check_phases.py once per phase under torchrun on one GPU (the product's loop
# code: TorchrunSession, build, train_step; no Ray), in order of value: nccl (only with 2 or more GPUs),
# throughput (the 7B compiled row first), memory, l4, precision, lora. Each phase has its own timeout
# (TIMEOUT_*_S below, together at most 360 s, so a rerun fits the machine's 15 minutes) and writes
# each row the moment it has it, so a phase cut short keeps the rows before it. First the shapes are
# planned for the GPU (the `fit` rows): every one must fit its memory, or nothing runs.
# OUTDIR gets at most 4 files, no folders: summary.md (the table, measured beside the planner),
# results.json (every row), log.txt (every phase's output), nvidia-smi.txt (not in a dry run).
#
# pydantic (which raydlc's config needs) is taken from the wheels in --wheels DIR (default
# benchmarks/wheels, made by benchmarks/fetch_wheels.sh) when the Python lacks it: unpacked into a
# throwaway folder put on PYTHONPATH; nothing else is installed, nothing is fetched.
# --dry-run runs every phase at toy size on the CPU (gloo): the same code paths, no GPU, limits tripled.
# --gpu names the GPU the planner plans for (a key of raydlc.facts.instances.GPUS: h100, h200, l4, ...);
# default auto: the GPU torch sees (its name), or h100 in a dry run.
set -uo pipefail

TIMEOUT_NVIDIA_SMI_S=10
TIMEOUT_NCCL_S=20
TIMEOUT_THROUGHPUT_S=160
TIMEOUT_MEMORY_S=40
TIMEOUT_L4_S=40
TIMEOUT_PRECISION_S=60
TIMEOUT_LORA_S=40
PHASES=(nccl:$TIMEOUT_NCCL_S throughput:$TIMEOUT_THROUGHPUT_S memory:$TIMEOUT_MEMORY_S l4:$TIMEOUT_L4_S precision:$TIMEOUT_PRECISION_S lora:$TIMEOUT_LORA_S)

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }
fail() { echo "error: $1" >&2; [ $# -gt 1 ] && echo "  hint: $2" >&2; exit "${3:-2}"; }

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DRY_RUN=0
GPU=auto
PY="${PYTHON:-python3}"
WHEELS="$ROOT/benchmarks/wheels"
OUTDIR=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --gpu) [ $# -ge 2 ] || fail "--gpu needs a value" "e.g. --gpu h200"; GPU="$2"; shift ;;
    --python) [ $# -ge 2 ] || fail "--python needs a value" "e.g. --python python3"; PY="$2"; shift ;;
    --wheels) [ $# -ge 2 ] || fail "--wheels needs a value" "e.g. --wheels benchmarks/wheels"; WHEELS="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) fail "unknown option $1" "see $0 --help" ;;
    *) [ -z "$OUTDIR" ] || fail "one OUTDIR only, got '$OUTDIR' and '$1'" "see $0 --help"; OUTDIR="$1" ;;
  esac
  shift
done
[ -n "$OUTDIR" ] || fail "no OUTDIR" "pass the folder the results go to (on the GPU machine: \"\$OUT\")"
command -v "$PY" >/dev/null 2>&1 || fail "no Python at '$PY'" "pass --python PATH (a Python with torch and transformers)"
mkdir -p "$OUTDIR" 2>/dev/null && [ -w "$OUTDIR" ] || fail "cannot write to OUTDIR $OUTDIR" "pass a writable folder"
OUTDIR="$(cd "$OUTDIR" && pwd)"
LOG="$OUTDIR/log.txt"
: > "$LOG"

export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false TRANSFORMERS_VERBOSITY=error PYTHONUNBUFFERED=1
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
[ "$DRY_RUN" = 1 ] && export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT"

if ! "$PY" -c "import pydantic" 2>/dev/null; then
  ls "$WHEELS"/*.whl >/dev/null 2>&1 || fail "'$PY' has no pydantic and $WHEELS has no wheels" "run benchmarks/fetch_wheels.sh here, and carry benchmarks/wheels"
  SITE="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-site.XXXXXX")"
  trap 'rm -rf "$SITE"' EXIT
  # A wheel is a zip of its site-packages files: unpacking it onto PYTHONPATH installs it for this run only.
  "$PY" -c "import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]" "$SITE" "$WHEELS"/*.whl \
    || fail "could not unpack the wheels in $WHEELS" "rerun benchmarks/fetch_wheels.sh" 1
  export PYTHONPATH="$PYTHONPATH:$SITE"
  echo "pydantic from the wheels in $WHEELS" | tee -a "$LOG"
fi
"$PY" -c "import raydlc.planner, raydlc.train.loop, torch, transformers" >>"$LOG" 2>&1 \
  || fail "'$PY' cannot import the loop's code (see $LOG)" "it needs torch, transformers, numpy, pyyaml and pydantic (the wheels)" 1
if [ "$GPU" = auto ] && [ "$DRY_RUN" = 1 ]; then
  GPU=h100  # the GPU machine's default: a dry run plans for it
elif [ "$GPU" = auto ]; then
  GPU="$("$PY" benchmarks/gpu_check_phases.py detect --out "$OUTDIR" 2>>"$LOG" | tail -1)"
  [ -n "$GPU" ] || fail "this machine's GPU is not one raydlc knows (see $LOG)" "pass --gpu with a key of raydlc.facts.instances.GPUS"
fi
"$PY" -c "import sys; from raydlc.facts.instances import GPUS; sys.exit(sys.argv[1] not in GPUS)" "$GPU" \
  || fail "unknown GPU '$GPU'" "pass --gpu with a key of raydlc.facts.instances.GPUS"
echo "planning for GPU $GPU" | tee -a "$LOG"
"$PY" benchmarks/gpu_check_phases.py fit --gpu "$GPU" --out "$OUTDIR" >>"$LOG" 2>&1 \
  || { "$PY" benchmarks/gpu_check_phases.py table --out "$OUTDIR"; fail "a shape planned for $GPU does not fit its memory (the fit rows)" "see $OUTDIR/summary.md" 1; }
"$PY" -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0], 'cuda', torch.cuda.is_available())" | tee -a "$LOG"

TOY=()
if [ "$DRY_RUN" = 1 ]; then
  TOY=(--toy)
  echo "dry run: every phase at toy size on the CPU" | tee -a "$LOG"
else
  "$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null || fail "torch sees no CUDA GPU" "run on the GPU machine, or use --dry-run" 1
  timeout "$TIMEOUT_NVIDIA_SMI_S" nvidia-smi > "$OUTDIR/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed" | tee -a "$LOG"
fi

STATUS=0
for entry in "${PHASES[@]}"; do
  name="${entry%%:*}" limit="${entry##*:}" t0=$SECONDS
  # The limits are sized for the GPU machine (16 cores); a dry run checks code paths on a CPU that may be busy.
  [ "$DRY_RUN" = 1 ] && limit=$((limit * 3))
  echo "== $name (at most ${limit}s)" | tee -a "$LOG"
  timeout --kill-after=5 "$limit" "$PY" -m torch.distributed.run --standalone --nproc-per-node=1 \
    benchmarks/gpu_check_phases.py "$name" --out "$OUTDIR" --gpu "$GPU" "${TOY[@]}" >>"$LOG" 2>&1
  rc=$?
  if [ "$rc" = 0 ]; then
    echo "   done in $((SECONDS - t0))s" | tee -a "$LOG"
  else
    echo "   FAILED after $((SECONDS - t0))s (exit $rc$([ "$rc" = 124 ] && echo ', timed out')); the rows it wrote stand" | tee -a "$LOG"
    STATUS=1
  fi
done
"$PY" benchmarks/gpu_check_phases.py table --out "$OUTDIR" || STATUS=1
grep -q '"status": "error"' "$OUTDIR/results.json" 2>/dev/null && STATUS=1
exit "$STATUS"
