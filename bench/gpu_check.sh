#!/usr/bin/env bash
# Learner speed on a lent GPU beside this repo's CPU figures (docs/gpu-check.md).
#
#   bench/gpu_check.sh [--cpu] [--out DIR] [--work DIR] [--cpu-figures FILE] [--model-dir DIR]
#
# GPU mode (default): on cuda, fp32 then bf16: the control learner iteration on the default config's
# batch (env steps/s) and the llm learner iteration on configs/gsm-tiny.toml's batch with the tiny
# model (tokens/s); then a table of those rows and the CPU figures file's; then the llm learner's chunked
# log-probs at a 0.5B model's output shape and the held-out evaluation's draws on cuda against the CPU;
# then, where pyzmq and gymnasium are installed, bench/learner_scaling.py on cuda (3 runs of 25 s). Sized to end well inside 5
# minutes, but it has never run on a GPU (docs/gpu-check.md); needs only python3 with torch, numpy,
# transformers and tokenizers (no pyzmq, gymnasium or mujoco).
# --cpu: the same code path on the CPU, fp32, fewer repeats: what made bench/gpu_check_cpu.jsonl.
#
# Results: OUT/gpu_check.jsonl (one JSON line per case) and OUT/gpu_check.md (the table); the tiny
# model is prepared in WORK/tiny-qwen2-s0 (default /tmp/asyncrl-gpu-check), or --model-dir is used.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=gpu
work=${TMPDIR:-/tmp}/asyncrl-gpu-check
out=${OUT:-$work}
cpu_figures=bench/gpu_check_cpu.jsonl
model_dir=
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu) mode=cpu ;;
        --out) out=$2; shift ;;
        --work) work=$2; shift ;;
        --cpu-figures) cpu_figures=$2; shift ;;
        --model-dir) model_dir=$2; shift ;;
        -h|--help) sed -n 2,14p "$0"; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

py=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
mkdir -p "$out" "$work"
results=$out/gpu_check.jsonl
: > "$results"

echo "gpu_check: mode $mode, $(date -u +%FT%TZ), $(uname -n), load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$py" -c 'import sys, torch; print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda available: {torch.cuda.is_available()}" + (f", {torch.cuda.get_device_name(0)}, bf16 supported: {torch.cuda.is_bf16_supported()}" if torch.cuda.is_available() else ""))'
if [ "$mode" = gpu ]; then
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
fi

if [ -z "$model_dir" ]; then   # the tiny model of `asyncrl llm prepare` (tokenizer + Qwen2 of configs/llm/tiny-qwen2.json)
    model_dir=$work/tiny-qwen2-s0
    "$py" -c 'import sys; from asyncrl.tasks.llm import model as m; p, reused = m.prepare(sys.argv[1], seed=0); print("tiny model:", p, "(reused)" if reused else "(prepared)")' "$model_dir"
fi

run() { "$py" bench/learner_speed.py --out "$results" --model-dir "$model_dir" "$@"; }
if [ "$mode" = gpu ]; then
    for precision in fp32 bf16; do
        run --task control --device cuda --precision "$precision" --warmup 3 --repeats 10
        run --task llm --device cuda --precision "$precision" --warmup 3 --repeats 10
    done
    run --task control --device cuda --precision fp32 --compile --warmup 3 --repeats 10   # learner.compile
    # llm: the learner's chunked log-probs at Qwen2.5-0.5B's output shape (peak memory per chunk size), and
    # the held-out evaluation's draws: the same tokens on cuda as on the CPU from the same per-problem uniforms
    "$py" bench/llm_logprob_chunks.py --hidden 896 --vocab 151936 --rows 64 --device cuda --repeats 2 | tee "$out/llm_logprob_chunks.jsonl"
    "$py" - "$model_dir" <<'PY' | tee "$out/llm_eval_draws.txt"
import sys, torch
from asyncrl.tasks.llm import gsm_problems, model as m, sampling
from asyncrl.tasks.llm.eval_draws import problem_uniforms
problems = gsm_problems.make_splits(seed=0, n_train=0, n_heldout=32).heldout
texts = {}
for device in ("cpu", "cuda"):
    loaded = m.load(sys.argv[1])
    u = problem_uniforms(0, len(problems), 48)
    texts[device] = sampling.eval_completions(loaded.model.to(device), loaded.tokenizer, problems, greedy=False, max_new_tokens=48, batch_size=16, temperature=0.6, uniforms=u)
same = sum(a == b for a, b in zip(texts["cpu"], texts["cuda"]))
print(f"llm eval draws: {same} of {len(problems)} completions identical on cpu and cuda (float rounding may change a few)")
PY
    figures=()
    if [ -f "$cpu_figures" ]; then figures=(--cpu-figures "$cpu_figures"); else echo "no CPU figures file $cpu_figures"; fi
    "$py" bench/learner_speed.py --report "$results" "${figures[@]}" | tee "$out/gpu_check.md"
    # the scaling benchmark's absolute figures: whole `asyncrl run`s on the toy env with the learner on cuda,
    # one learner (one GPU), batch 1,024 to 16,384 samples; needs the package's own dependencies
    if "$py" -c 'import zmq, msgpack, gymnasium, click' 2>/dev/null; then
        "$py" bench/learner_scaling.py --device cuda --learners 1 --actors 2 --slots 2,8,32 --seconds 25 --warmup 8 \
            --out "$out/learner_scaling.jsonl"
        "$py" bench/learner_scaling.py --report "$out/learner_scaling.jsonl" --plot "$out/learner_scaling.png" | tee "$out/learner_scaling.md"
    else
        echo "learner scaling skipped: it runs asyncrl's processes and needs pyzmq, msgpack, gymnasium and click"
    fi
else
    run --task control --device cpu --precision fp32 --warmup 1 --repeats 5
    run --task llm --device cpu --precision fp32 --warmup 1 --repeats 3
    "$py" bench/learner_speed.py --report "$results" | tee "$out/gpu_check.md"
fi
echo "gpu_check: results in $results and $out/gpu_check.md"
