"""grpokit's own decode loop behind `sample_groups` (the "fast" backend).

Why not `model.generate`: GRPO samples G completions of the same prompt, so the prompt is prefilled
once and its keys/values are kept once, read by the group's G rows (not recomputed or copied); rows that
have finished are dropped from the batch so they stop costing compute; and the sampling log-probs come
out with the tokens, so mu = 1 needs no extra forward pass for the old policy.

Two engines, chosen per model:
  * lean   (Llama, Qwen2, Qwen3, Mistral with plain nn.Linear weights): a decoder step written
           against the model's own weights, q/k/v and gate/up fused into one matmul each, rotary
           tables built once, and a KV cache the sampler owns: preallocated tensors, the prompts' slots
           [layers, 2, B, kv_heads, P, head_dim] and each row's own [layers, 2, N, kv_heads, T, head_dim],
           written in place (no per-step concatenation);
           large weights packed once per call for oneDNN (`decode_linear.DecodeLinear`).
  * cached (other known architectures): the model's forward with a transformers DynamicCache.
Anything else goes to `model.generate` (groups.py), with one log line.

The distribution is exactly `generate`'s: logits / temperature, then top-k, then top-p (the order of
transformers' logits warpers), then a categorical draw (`grpokit.rollout.sampling`); EOS suppression is
min_new_tokens' -inf. The returned log-probs are those of the temperature-scaled full distribution,

    logp_t = z_t[o_t] / tau - logsumexp(z_t / tau),

which is what `per_token_logprobs` recomputes, so they can stand in for the old policy's log-probs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

import torch
import torch.nn.functional as F

from grpokit.model import speedups
from grpokit.model.llama_layer import LayerSpec, decoder_layer, gated_mlp_input, rms_norm, signed_sin
from grpokit.model.loading import eval_mode
from grpokit.model.lora import effective_linear
from grpokit.model.precision import autocast_for, compute_dtype
from grpokit.model.shared_prompts import CACHE_MODEL_TYPES, position_ids_from_mask
from grpokit.rollout.cached_engine import CachedEngine
from grpokit.rollout.decode_linear import DecodeLinear, fused
from grpokit.rollout.decode_loop import Draw, SingleTurn, check_every, decode
from grpokit.rollout.tree import TreeRows, TreeSpec
from grpokit.rollout.turns import TurnDriver, TurnRows

log = logging.getLogger("grpokit")

# Architectures whose forward takes (input_ids, attention_mask, position_ids, cache) and a DynamicCache.
FAST_MODEL_TYPES = CACHE_MODEL_TYPES
# Architectures the lean decoder implements (pre-norm, rotary, gated MLP, optional q/k norm).
LEAN_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
_warned: set[str] = set()


def choose_backend(model, backend: str) -> bool:
    """True to use the fast sampler. 'auto' picks it when the architecture is known to work."""
    if backend == "fast":
        return True
    if backend == "generate":
        return False
    # backend "vllm": training rollouts go to grpokit.rollout.vllm_backend; direct calls (evaluation)
    # pick as "auto"
    model_type = getattr(getattr(model, "config", None), "model_type", "")
    ok = model_type in FAST_MODEL_TYPES
    if not ok and model_type not in _warned:
        _warned.add(model_type)
        log.info("sampler: architecture '%s' is not on the fast path; using model.generate", model_type)
    return ok


def _plain_linear(m) -> bool:
    return type(m) is torch.nn.Linear


def lean_supported(model, max_positions: int) -> bool:
    """Whether the lean decoder reproduces this model's forward (else the cached engine is used)."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "model_type", "") not in LEAN_MODEL_TYPES or not hasattr(model, "get_decoder"):
        return False
    dec = model.get_decoder()
    if not all(hasattr(dec, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    rope = getattr(dec.rotary_emb, "rope_type", "default")
    if "dynamic" in rope or "longrope" in rope:
        return False                                                      # inv_freq depends on the length
    window = getattr(cfg, "sliding_window", None)
    if window and "sliding_attention" in (getattr(cfg, "layer_types", None) or ["sliding_attention"]) \
            and (cfg.model_type == "mistral" or getattr(cfg, "use_sliding_window", False)) \
            and window < max_positions:
        return False
    for layer in dec.layers:
        a, m = layer.self_attn, layer.mlp
        if any(effective_linear(x) is None for x in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj,
                                                      m.up_proj, m.down_proj)):
            return False                                                  # quantized layers, DoRA
    if any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()):
        return False                                                      # hooks would be bypassed
    return _plain_linear(model.get_output_embeddings())


# Prompts up to this length are prefilled as one-call decode steps (the switch's `whole_step`, `.prefill`);
# longer ones as one batched pass. Tiny bench model, 4 prompts: 2.9 vs 4.0 ms at 10 tokens, 7.2 vs 5.5 ms
# at 32, 13.2 vs 8.1 at 64.
PREFILL_STEPS_MAX = 16
# Each prompt's cache slots kept once and read by its G rows (else copied to every row). GSM8K, SmolLM2 bf16,
# 256 tokens (benchmarks/prompt_cache.py): 1.48x at 4 x 8 rows, 1.35x at 16 x 8 (KV cache 1805 vs 4359 MiB).
SHARE_PROMPT_CACHE = True
# On CUDA with bf16 compute the lean decoder caches and attends in bf16 (LeanDecoder.__init__).
CUDA_KV_IN_COMPUTE = True


class LeanDecoder:
    """A Llama-family decoder for sampling: fused weights, rotary tables, and an owned KV cache."""

    def __init__(self, model, rows: int, max_len: int, prompts: int = 0, prompt_len: int = 0) -> None:
        dec, cfg = model.get_decoder(), model.config
        # bf16 matmuls (grpokit.model.precision) or None
        self.compute = compute = compute_dtype(model)
        a0 = dec.layers[0].self_attn
        self.hd = a0.head_dim
        self.nh = cfg.num_attention_heads
        self.nkv = cfg.num_key_value_heads
        self.eps = dec.norm.variance_epsilon
        self.embed, self.final_norm = dec.embed_tokens.weight, dec.norm.weight
        head = model.get_output_embeddings()
        self.head = DecodeLinear(head.weight, head.bias, rows, compute)
        self.layers = []
        for layer in dec.layers:
            a, m = layer.self_attn, layer.mlp
            spec = LayerSpec.of(layer, cfg)
            self.layers.append({
                "qkv": fused(a.q_proj, a.k_proj, a.v_proj, rows=rows, compute=compute),
                "o": fused(a.o_proj, rows=rows, compute=compute),
                "gu": fused(m.gate_proj, m.up_proj, rows=rows, compute=compute),
                "down": fused(m.down_proj, rows=rows, compute=compute), "act": m.act_fn,
                "ln1": spec.ln1, "ln2": spec.ln2, "scale": a.scaling, "q_norm": spec.q_norm,
                "k_norm": spec.k_norm,
                "spec": dataclasses.replace(spec, eps=self.eps)})   # the final norm's eps, as before
        w = self.embed
        positions = torch.arange(max_len, device=w.device)[None]          # [1, S]
        cos, sin = dec.rotary_emb(w[:1][None], positions)                 # [1, S, hd] each
        self.cos, self.sin = cos[0], signed_sin(sin[0])   # rotate_half(x) * sin == roll(x, hd/2) * signed
        # the record of the projection outputs (`speedups.Speedups.start_record`), the decode step
        self.record, self.record_step = None, None
        scope = speedups.active()                      # the one switch's speed-ups, or the plain answers
        self.native = scope.decode_kernels(model)      # C kernels for the steps below, or None
        self.silu = getattr(cfg, "hidden_act", None) in ("silu", "swish")
        self.whole = scope.whole_step(self, rows)      # the whole step in one C call where it applies; None
        # The KV cache. With the C kernels, G > 1 rows per prompt and no one-call step (whose short prompts
        # are cheap to copy), each prompt's slots are kept once, `prefix` [layers, 2, B, kv_heads, P, hd],
        # and read by its G rows (`prefix_row`: each row's prompt); `kv` then holds each row's own slots
        # from P on. Else (the readable path, CUDA) each row's cache holds a copy of its prompt's slots.
        shared = SHARE_PROMPT_CACHE and self.native is not None and self.whole is None \
            and 0 < prompts < rows and prompt_len > 0
        self.base = prompt_len if shared else 0                      # cache slot s lives in kv at s - base
        self.prefix = torch.empty(len(self.layers), 2, prompts, self.nkv, prompt_len, self.hd, dtype=w.dtype,
                                  device=w.device) if shared else None
        self.prefix_row = torch.arange(prompts, device=w.device).repeat_interleave(rows // prompts) \
            if shared else None
        # CUDA with bf16 compute: keys and values cached and attended in bf16, as the training forward's
        # autocast SDPA does (half the cache bytes); on the CPU they stay float32 (the C kernels read it).
        gpu_bf16 = compute is not None and w.device.type == "cuda" and CUDA_KV_IN_COMPUTE
        kv_dtype = compute if gpu_bf16 else w.dtype
        self.kv = torch.empty(len(self.layers), 2, rows, self.nkv, max_len - self.base, self.hd,
                              dtype=kv_dtype, device=w.device)

    def dims(self) -> dict[str, int]:
        """Output width of each projection (what an ActivationRecord stores per position)."""
        return {k: self.layers[0][k].weight.shape[0] for k in ("qkv", "o", "gu", "down")}

    def _proj(self, i: int, name: str, x: torch.Tensor) -> torch.Tensor:
        y = self.layers[i][name](x)
        if self.record is not None:
            self.record.put(i, name, y, self.record_step)
        return y

    def _layers(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: slice,
                mask: torch.Tensor, rows: int) -> torch.Tensor:
        """h [n, L, H] through every layer (`llama_layer.decoder_layer`); keys/values of the L new positions
        go to cache `slots`."""
        n, b = h.shape[0], self.base
        for i, w in enumerate(self.layers):
            cache = self.kv[i, :, :rows]                                  # [2, rows, kv_heads, S - base, hd]
            pre = None if self.prefix is None else self.prefix[i]         # [2, B, kv_heads, P, hd]

            def attend(q, k, v, cache=cache, pre=pre, scale=w["scale"]):
                if pre is not None and n < rows:   # prefill: the prompt's keys/values, once per prompt
                    pre[0, :, :, slots], pre[1, :, :, slots] = k, v
                elif n < rows:  # prefill: attend within the prompt; its keys/values go to each of the G rows
                    cache[0, :, :, slots] = k.repeat_interleave(rows // n, 0)
                    cache[1, :, :, slots] = v.repeat_interleave(rows // n, 0)
                else:           # decode (or G = 1): write the new slot, attend over every slot so far
                    own = slice(slots.start - b, slots.stop - b)
                    cache[0, :, :, own], cache[1, :, :, own] = k, v
                    k, v = cache[0, :, :, :own.stop], cache[1, :, :, :own.stop]
                    if pre is not None:   # the row's prompt slots first (a shared cache read without kernels)
                        k = torch.cat([pre[0, self.prefix_row], k], 2)
                        v = torch.cat([pre[1, self.prefix_row], v], 2)
                return F.scaled_dot_product_attention(q.to(k.dtype), k, v, attn_mask=mask, scale=scale,
                                                      enable_gqa=self.nkv != self.nh)   # [n, nh, L, hd]

            h = decoder_layer(h, w["spec"], project=lambda name, x, i=i: self._proj(i, name, x), cos=cos,
                              sin=sin, attend=attend)
        return rms_norm(h[:, -1], self.final_norm, self.eps)               # [n, H], last position only

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, group_size: int) -> torch.Tensor:
        """Prompts [B, P] (left-padded) once; their keys/values fill cache rows b*G..b*G+G-1.
        Returns [B, V]."""
        B, P = ids.shape
        pos = position_ids_from_mask(mask)                                # [B, P]
        if self.whole is not None and self.record is None and P <= PREFILL_STEPS_MAX:
            return self.whole.prefill(ids, mask.bool(), pos, group_size)
        keep = torch.ones(P, P, dtype=torch.bool, device=ids.device).tril()[None] & mask.bool()[:, None, :]
        keep |= torch.eye(P, dtype=torch.bool, device=ids.device)        # pad queries see themselves: no NaN
        h = self._layers(F.embedding(ids, self.embed), self.cos[pos][:, None], self.sin[pos][:, None],
                         slice(0, P), keep[:, None], B * group_size)
        return self.head(h)

    def step(self, tok: torch.Tensor, pos: torch.Tensor, slot: int, key_mask: torch.Tensor) -> torch.Tensor:
        """One token per row: tok, pos [n]; key_mask [n, >= slot + 1] (valid key slots).
        Returns logits [n, V]."""
        n = tok.shape[0]
        if self.whole is not None and self.record is None:
            return self.whole(tok, pos, slot, key_mask)
        if self.native is not None:
            return self.head(self._layers_native(F.embedding(tok, self.embed), pos, slot, key_mask))
        h = self._layers(F.embedding(tok[:, None], self.embed), self.cos[pos][:, None, None],
                         self.sin[pos][:, None, None], slice(slot, slot + 1),
                         key_mask[:, None, None, :slot + 1], n)
        return self.head(h)

    def _layers_native(self, h: torch.Tensor, pos: torch.Tensor, slot: int,
                       key_mask: torch.Tensor) -> torch.Tensor:
        """`_layers` for one decode position with the fused kernels: h [n, H] (updated in place) -> [n, H]."""
        n = h.shape[0]
        k, x = self.native, torch.empty_like(h)
        att = h.new_empty(n, self.nh * self.hd)
        k.add_rms(h, None, self.layers[0]["ln1"], self.eps, x)
        for i, w in enumerate(self.layers):
            qkv = self._proj(i, "qkv", x[:, None])                         # [n, 1, (nh + 2 nkv) hd]
            k.rope_attend(qkv, pos, self.cos, self.sin, w["q_norm"], w["k_norm"], self.eps, self.kv[i, :, :n],
                          slot, key_mask, self.nh, w["scale"], att,
                          prefix=None if self.prefix is None else self.prefix[i], prefix_row=self.prefix_row)
            k.add_rms(h, self._proj(i, "o", att[:, None]), w["ln2"], self.eps, x)
            gu = self._proj(i, "gu", x[:, None])                            # [n, 1, 2 I]
            act = k.silu_mul(gu.view(n, -1))[:, None] if self.silu else gated_mlp_input(gu, w["act"])
            nxt = self.layers[i + 1]["ln1"] if i + 1 < len(self.layers) else self.final_norm
            k.add_rms(h, self._proj(i, "down", act), nxt, self.eps, x)
        return x

    def keep_rows(self, keep: torch.Tensor, upto: int) -> None:
        """Drop finished rows: copy the kept rows' first `upto` cache slots into a smaller cache (a shared
        prompt's slots stay where they are)."""
        L, _, _, nkv, S, hd = self.kv.shape
        kv = torch.empty(L, 2, keep.numel(), nkv, S, hd, dtype=self.kv.dtype, device=self.kv.device)
        kv[..., :upto - self.base, :] = self.kv[:, :, keep, :, :upto - self.base]
        self.kv = kv
        if self.prefix_row is not None:
            self.prefix_row = self.prefix_row[keep]


@torch.no_grad()
def fast_sample(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int,
                max_new_tokens: int, *, temperature: float, top_p: float, top_k: int, eos_ids: list[int],
                pad_id: int, suppress_eos: bool = False, greedy: bool = False,
                driver: TurnDriver | None = None, row0: int = 0,
                tree: TreeSpec | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample G completions per prompt with a shared-prefix KV cache.

    Args:
        prompt_ids, prompt_mask: [B, P] left-padded prompts (each prefilled once).
        group_size: G.
        greedy: argmax decoding (evaluation); log-probs are still those of the tempered distribution.
        driver: multi-turn rollouts (tools): rows stop at tool calls and are fed the results
            (`grpokit.rollout.turns.TurnRows`); None: one turn, the plain loop. row0: the first row's
            index in the driver's batch.
        tree: tree rollouts (`grpokit.rollout.tree`): the G rows of a prompt are the leaves of a tree whose
            paths share prefixes, each decoded once and its KV cache forked at the branch points.

    Inside a `grpokit.switch.accelerated` scope that records this model's batch, the lean engine records
    every projection output (`speedups.Speedups.start_record`) and hands it to the scope at the end.

    Returns:
        (completion_ids [B*G, T'], sampling log-probs [B*G, T']), T' <= max_new_tokens (the longest row).
        After a row's first EOS its entries are unspecified: the caller masks them (groups.py).
    """
    lean = lean_supported(model, prompt_ids.shape[1] + max_new_tokens)
    # the model's own forward runs in eval mode (no dropout), under bf16 autocast in mixed precision;
    # the lean decoder reads the weights only (and casts them itself: `DecodeLinear`)
    with contextlib.nullcontext() if lean else eval_mode(model), \
            contextlib.nullcontext() if lean else autocast_for(model):
        if lean:
            engine = _LeanEngine(model, prompt_ids, prompt_mask, group_size, max_new_tokens)
        else:
            engine = CachedEngine(model, prompt_ids, prompt_mask, group_size)
        N, device = prompt_ids.shape[0] * group_size, prompt_ids.device
        draw = Draw(temperature, top_p, top_k, greedy)
        if tree is not None:
            if lean:
                engine.dec.record = None      # forked rows are not the record's rows: no activation reuse
            rows = TreeRows(N, tree, max_new_tokens, pad_id, device, eos_ids=eos_ids,
                            every=check_every(device))
        elif driver is None:
            rows = SingleTurn(N, max_new_tokens, pad_id, device, eos_ids=eos_ids, suppress_eos=suppress_eos,
                              every=check_every(device))
        else:
            rows = TurnRows(N, max_new_tokens, pad_id, device, driver=driver, row0=row0)
        tokens, logps = decode(engine, rows, max_new_tokens, draw)
        record = engine.dec.record if lean else None
        if record is not None:
            record.finish(tokens)
            speedups.active().hold_record(record)
        return tokens, logps


class _LeanEngine:
    """Drives `LeanDecoder`: positions, key masks and the cache slot of each step."""

    def __init__(self, model, prompt_ids, prompt_mask, group_size: int, max_new_tokens: int) -> None:
        B, P = prompt_ids.shape
        self.P, N = P, B * group_size
        self.dec = LeanDecoder(model, N, P + max_new_tokens, prompts=B, prompt_len=P)
        self.dec.record = speedups.active().start_record(model, prompt_ids, prompt_mask, group_size,
                                                         max_new_tokens, self.dec.dims(),
                                                         len(self.dec.layers))   # None: not recording
        self.logits0 = self.dec.prefill(prompt_ids, prompt_mask, group_size).repeat_interleave(group_size, 0)
        mask = prompt_mask.bool().repeat_interleave(group_size, 0)
        self.key_mask = torch.cat([mask, mask.new_ones(N, max_new_tokens)], 1)   # [N, P + T] valid key slots
        self.pos = mask.sum(-1)                                           # next position of each row [N]

    def first_logits(self) -> torch.Tensor:
        return self.logits0

    @property
    def native(self):
        return self.dec.native

    def step(self, tok: torch.Tensor, t: int) -> torch.Tensor:
        slot = self.P + t
        self.dec.record_step = t
        logits = self.dec.step(tok, self.pos + t, slot, self.key_mask)
        return logits

    def keep_rows(self, keep: torch.Tensor, t: int) -> None:
        self.dec.keep_rows(keep, self.P + t)
        if self.dec.record is not None and not self.dec.record.keep_rows(keep, t):
            self.dec.record = None                                        # it can no longer pay: stop
        self.key_mask, self.pos = self.key_mask[keep], self.pos[keep]
