"""[D] fast path: the update's forward pass reuses the projections the sampler already computed.

With mu = 1 the first (or only) update runs the same weights on the same tokens the sampler has just
run. Most of a forward pass is its projections (q/k/v, o, gate/up, down: ~90% of the FLOPs on the
bench models), and the sampler has every one of their outputs. So the lean decoder
(`grpokit.rollout.sampler.LeanDecoder`) records them (`ActivationRecord`), and `reused_logprobs` rebuilds
the forward with autograd while taking each projection's output from the record:

    forward:   y = x W^T + b          (y read from the record, no matmul)
    backward:  dx = dy W,   dW = dy^T x,   db = sum_rows dy     (the usual linear backward)

Everything else (embedding, RMSNorm, rotary, attention, SiLU, residuals, final norm, lm-head and
log-softmax) is recomputed with autograd as in the plain pass, and prompts run once per group as in
`shared_prompts.shared_prompt_hidden`. The result equals the plain pass to float rounding: the sampler
computed y one position at a time, the plain pass all positions in one matmul.

The record is only used while it describes the model and the batch: same module, every parameter
unchanged since sampling (torch's in-place version counters, which an optimizer step bumps), no
dropout, the same prompts and tokens. Whether to record and to reuse at all is decided at the end of
this module (`recording_policy`, `reuse_pays`, `update_plan`; `rollout.reuse_activations`); the
record itself is held by the `grpokit.switch.accelerated` scope between sampling and the update.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grpokit.fast.fused_ops import silu_mul_halves
from grpokit.fast.native import kernels_for
from grpokit.model.buckets import launch_tokens, length_buckets
from grpokit.model.llama_layer import LayerSpec, decoder_layer, rms_norm, signed_sin
from grpokit.model.logprobs import head_logprobs
from grpokit.model.lora import is_peft_model
from grpokit.model.precision import compute_dtype
from grpokit.model.shared_prompts import checkpointing_enabled, position_ids_from_mask


class ActivationRecord:
    """Projection outputs of one sampling call, per layer: prompts [B, P, D] and completions [T-1, N, D]
    (slot-major, so each decode step writes one contiguous block).

    Completion slot t holds the outputs for input token t (the token sampled at step t, fed at step
    t + 1); the last sampled token is never fed, hence T - 1 slots. The buffers are not initialized:
    the slots of a row after it left the decode batch (finished) are zeroed up to the last step when
    decoding ends (`finish`), slots past it are never read, so every slot read is finite (a masked
    position times garbage could be NaN). Zeroing at the end touches no memory for a record dropped
    on the way.

    Memory: the forward's projection outputs of the whole batch. q/k/v, o and down are only needed by
    the forward (backward needs their inputs, which it recomputes), so `reused_logprobs(consume=True)`
    drops each layer's as soon as that layer has run; gate/up stay (SiLU's backward needs them, as in
    the plain pass), so the update's peak is that of the plain pass.
    """

    def __init__(self, model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int,
                 max_new_tokens: int, dims: dict[str, int], n_layers: int, pool: dict | None = None) -> None:
        N, slots = prompt_ids.shape[0] * group_size, max(max_new_tokens - 1, 0)
        w = model.get_output_embeddings().weight
        # spent records' gate/up buffers, reused by the next record of the same shape: writing into fresh
        # memory costs its first-touch page faults (~0.1 s a step on the small bench model). The caller
        # keeps the dict between steps (the train state's, through the switch); only gate/up: q/k/v, o
        # and down are freed during the forward (`consume`), and pooling them would keep them through
        # backward.
        self.pool = {} if pool is None else pool
        self.model_id = id(model)
        self.versions = _versions(model)
        self.prompt_ids, self.prompt_mask, self.group_size = prompt_ids, prompt_mask, group_size
        self.prompt: list[dict[str, torch.Tensor]] = [{} for _ in range(n_layers)]
        self.comp = [{k: _buffer(self.pool, k, (slots, N, d), w) for k, d in dims.items()}
                     for _ in range(n_layers)]
        self.rows: torch.Tensor | None = None                            # live rows in decoding (None = all)
        self.pays = None                # lengths [N] -> bool: keep recording? (`recording_policy`)
        self.prompt_len = prompt_mask.sum(-1).repeat_interleave(group_size)   # [N]
        self.ended = torch.full((N,), -1)                                 # completion tokens of dropped rows
        self.max_new_tokens = max_new_tokens
        # (step, rows) left unwritten from that step on
        self.drops: list[tuple[int, torch.Tensor]] = []
        self.completion_ids: torch.Tensor | None = None                  # [N, T'] sampled tokens, once done

    def put(self, layer: int, name: str, y: torch.Tensor, step: int | None) -> None:
        """y [n, L, D]: the prompt pass (step None) or decode step `step` (L = 1)."""
        if step is None:
            self.prompt[layer][name] = y
        elif self.rows is None:
            self.comp[layer][name][step] = y[:, 0]
        else:
            self.comp[layer][name][step, self.rows] = y[:, 0]

    def keep_rows(self, keep: torch.Tensor, step: int) -> bool:
        """Rows not in `keep` are not fed from `step` on: zero those slots (the buffers start uninitialized).

        Returns False when the record will not pay for itself (`pays`), judged with every live row
        running to max_new_tokens (its worst case: the most padding in one micro-batch) and a dropped
        row at step + 1 tokens (at most): the caller then drops it.
        """
        live = torch.arange(self.ended.numel()) if self.rows is None else self.rows
        dropped = live[~torch.isin(torch.arange(live.numel()), keep)]
        self.ended[dropped] = step + 1
        self.rows = live[keep]
        lengths = self.prompt_len + torch.where(self.ended >= 0, self.ended, self.max_new_tokens)
        if self.pays is not None and not self.pays(lengths):
            return False
        self.drops.append((step, dropped))
        return True

    def finish(self, completion_ids: torch.Tensor) -> None:
        """Decoding ended with completion_ids [N, T']: zero the dropped rows' slots up to T' - 2."""
        self.completion_ids = completion_ids                              # what the positions were fed
        last = completion_ids.shape[1] - 1
        for step, rows in self.drops:
            for layer in self.comp:
                for buf in layer.values():
                    buf[step:last, rows] = 0
        self.drops = []

    def usable(self, model, rollout=None) -> bool:
        """Whether this record still describes `model` (same weights, nothing stochastic in its forward)
        and, when given, `rollout` (the same prompts, and the tokens it was fed wherever the mask is on)."""
        cfg = getattr(model, "config", None)
        dropout = float(getattr(cfg, "attention_dropout", 0.0) or 0.0) if model.training else 0.0
        if not self.comp or id(model) != self.model_id or dropout != 0.0 or _versions(model) != self.versions:
            return False
        return rollout is None or self._fed(rollout)

    def _fed(self, rollout) -> bool:
        G, fed = self.group_size, self.completion_ids
        ids, mask = rollout.completion_ids, rollout.completion_mask.bool()
        if fed is None or ids.shape[0] != fed.shape[0] or ids.shape[1] > fed.shape[1] \
                or not torch.equal(rollout.prompt_ids, self.prompt_ids.repeat_interleave(G, 0)) \
                or not torch.equal(rollout.prompt_mask.bool(),
                                   self.prompt_mask.bool().repeat_interleave(G, 0)):
            return False
        return bool((ids == fed[:, :ids.shape[1]])[mask].all())

    def release(self) -> None:
        """The record is spent (call it after the backward that used it): the gate/up buffers go to the
        pool for the next record, everything else is dropped."""
        self.pool.clear()
        for layer in self.comp:
            if "gu" in layer:
                self.pool.setdefault(_key(layer["gu"]), []).append(layer["gu"])
        self.comp, self.prompt = [], []

    def logprobs(self, model, rows: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 completion_length: int, **kw):
        """The update's forward on this record: `reused_logprobs` (same arguments, same returns)."""
        return reused_logprobs(model, self, rows, input_ids, attention_mask, completion_length, **kw)


def _key(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.dtype, t.device


def _buffer(pool: dict, name: str, shape: tuple, like: torch.Tensor) -> torch.Tensor:
    pooled = pool.get((shape, like.dtype, like.device)) if name == "gu" else None
    return pooled.pop() if pooled else torch.empty(shape, dtype=like.dtype, device=like.device)


def _versions(model) -> tuple[int, ...]:
    return tuple(p._version for p in model.parameters())


class _RecordedProjection(torch.autograd.Function):
    """y = x [W_1; W_2; ...]^T + [b_1; b_2; ...] with y given: forward returns it, backward is linear's."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, y: torch.Tensor, *params):          # params: W_1, b_1, W_2, b_2, ...
        weights = params[0::2]
        ctx.save_for_backward(x, *weights)
        return y.view_as(y)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, *weights = ctx.saved_tensors
        need_w, need_b = ctx.needs_input_grad[2::2], ctx.needs_input_grad[3::2]
        dy2 = dy.reshape(-1, dy.shape[-1])                                # [rows, D_out]
        W = weights[0] if len(weights) == 1 else torch.cat(weights)      # [D_out, D_in]
        dx = (dy2 @ W).view(x.shape) if ctx.needs_input_grad[0] else None
        dW = dy2.t() @ x.reshape(-1, x.shape[-1]) if any(need_w) else None  # [D_out, D_in]
        db = dy2.sum(0) if any(need_b) else None
        grads: list[torch.Tensor | None] = [dx, None]
        start = 0
        for i, w in enumerate(weights):                                   # each weight's block of rows
            end = start + w.shape[0]
            grads += [dW[start:end] if need_w[i] else None, db[start:end] if need_b[i] else None]
            start = end
        return tuple(grads)


def _project(x: torch.Tensor, y: torch.Tensor, *mods) -> torch.Tensor:
    params = [t for m in mods for t in (m.weight, m.bias)]
    return _RecordedProjection.apply(x, y, *params)


def _rotary(dec, h: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, signed sin [n, 1, L, hd] (`llama_layer.signed_sin`)."""
    cos, sin = dec.rotary_emb(h, pos)
    return cos[:, None], signed_sin(sin)[:, None]


def _layer(layer, cfg, h, rec: dict[str, torch.Tensor], cos, sin, mask, past: tuple | None, lib):
    """One decoder layer with autograd (`llama_layer.decoder_layer`), projections from the record.
    Returns (h, (k, v)) with this pass's keys/values. lib: grpokit's C kernels (SiLU x up on the
    recorded [gate | up], saving only it for backward) or None."""
    a, m = layer.self_attn, layer.mlp
    mods = {"qkv": (a.q_proj, a.k_proj, a.v_proj), "o": (a.o_proj,), "gu": (m.gate_proj, m.up_proj),
            "down": (m.down_proj,)}
    kv: list[tuple] = []

    def attend(q, k, v):
        kv.append((k, v))
        if past is not None:                                              # completion pass: prompt keys first
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=a.scaling,
                                              enable_gqa=k.shape[1] != q.shape[1])

    def project(name: str, x: torch.Tensor) -> torch.Tensor:
        return _project(x, rec[name], *mods[name])

    h = decoder_layer(h, LayerSpec.of(layer, cfg), project=project, cos=cos, sin=sin, attend=attend,
                      gated=lambda gu: silu_mul_halves(gu, m.act_fn, lib))
    return h, kv[0]


def _rows_view(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """t[:, rows] as a view when rows are consecutive (the usual whole-batch micro-batch), else a gather."""
    n = rows.numel()
    if n and bool((rows == rows[0] + torch.arange(n, device=rows.device)).all()):
        return t[:, int(rows[0]):int(rows[0]) + n]
    return t.index_select(1, rows)


def reused_logprobs(model, record: ActivationRecord, rows: torch.Tensor, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor, completion_length: int, *, temperature: float = 1.0,
                    chunk_rows: int = 1024, return_entropy: bool = False, consume: bool = False):
    """`per_token_logprobs` for rollout rows `rows`, the projections taken from `record`.

    input_ids, attention_mask: [n, P' + T], the rows' prompts (trimmed on the left to P' columns) and
    completions trimmed to T, as `update.rows_logprobs` builds them. Returns [n, T] (and entropy [n, T]).
    consume: the last use of the record: each layer's q/k/v, o and down outputs are dropped once the
    layer has run (backward does not need them), so they do not add to the peak memory of backward.
    """
    T, dec, cfg = completion_length, model.get_decoder(), model.config
    lib = kernels_for(model)
    Pp = input_ids.shape[1] - T
    P0 = record.prompt_ids.shape[1] - Pp                                  # columns trimmed on the left
    uniq, inv = torch.unique(rows // record.group_size, return_inverse=True)  # prompts of these rows
    p_ids, p_mask = record.prompt_ids[uniq, P0:], record.prompt_mask[uniq, P0:]
    U = uniq.numel()
    keep = torch.ones(Pp, Pp, dtype=torch.bool, device=p_ids.device).tril()[None] & p_mask.bool()[:, None, :]
    keep |= torch.eye(Pp, dtype=torch.bool, device=p_ids.device)          # pad queries see themselves
    hp = dec.embed_tokens(p_ids)                                          # [U, P', H]
    cos_p, sin_p = _rotary(dec, hp, position_ids_from_mask(p_mask))
    L = T - 1                                                             # completion inputs
    if L:
        hc = dec.embed_tokens(input_ids[:, Pp:-1])                        # [n, L, H]
        c_pos = p_mask.sum(-1).index_select(0, inv)[:, None] + torch.arange(L, device=hp.device)
        cos_c, sin_c = _rotary(dec, hc, c_pos)
        key_ok = torch.cat([p_mask.index_select(0, inv), attention_mask[:, Pp:-1]], 1).bool()  # [n, P'+L]
        causal = (torch.arange(Pp + L, device=hp.device)[None]
                  <= Pp + torch.arange(L, device=hp.device)[:, None])
        c_mask = (key_ok[:, None, :] & causal[None])[:, None]             # [n, 1, L, P'+L]
    for i, layer in enumerate(dec.layers):
        rec_p = {k: v.index_select(0, uniq)[:, P0:] if v.shape[0] != U or P0 else v
                 for k, v in record.prompt[i].items()}
        hp, (k, v) = _layer(layer, cfg, hp, rec_p, cos_p, sin_p, keep[:, None], None, lib)
        if L:
            rec_c = {k2: _rows_view(v2[:L], rows).transpose(0, 1)                         # [n, L, D]
                     for k2, v2 in record.comp[i].items()}
            past = (k.index_select(0, inv), v.index_select(0, inv))
            hc, _ = _layer(layer, cfg, hc, rec_c, cos_c, sin_c, c_mask, past, lib)
        if consume:
            for part in (record.prompt[i], record.comp[i]):
                for name in ("qkv", "o", "down"):
                    part.pop(name, None)
            rec_p = rec_c = None
    last = hp[:, -1:].index_select(0, inv)                                # [n, 1, H] predicts token 0
    hidden = torch.cat([last, hc], 1) if L else last                      # [n, T, H]
    hidden = rms_norm(hidden, dec.norm.weight, dec.norm.variance_epsilon)
    head = model.get_output_embeddings()
    return head_logprobs(hidden, input_ids[:, -T:], head.weight, head.bias, temperature=temperature,
                         chunk_rows=chunk_rows, return_entropy=return_entropy)


# When to reuse ---------------------------------------------------------------------------------------

# rollout.reuse_activations=auto: below this many parameters the reused forward's extra Python work per
# layer (and the sampler's recording) costs more than the projection matmuls it saves (bench, 2-core
# CPU: forced on the 1.1M "tiny" model a step was ~5% slower, the 24M "small" one gained 10-25%).
REUSE_MIN_PARAMS = 5_000_000
# With the projections reused, the update runs about 2/3 of a forward + backward's FLOPs (the forward's
# projection matmuls, a third, are skipped).
REUSE_COST = 2 / 3


def recording_policy(cfg, world_size: int, model):
    """What the sampler records inside `switch.accelerated(model, cfg)` (decided once, at entry): False (no
    record), True (record), or for "auto" a function lengths [N] -> bool that the sampler asks whenever
    rows finish, dropping the record once it will not pay (`reuse_pays`, live rows counted at the limit).

    Never with packed updates (optim.padding_free), several processes, another sampler, PPO, dynamic
    sampling (its batches are merged), MCTS rollouts (many decode calls, none over the batch's rows) or
    gradient checkpointing (which asks for less memory than a record holds). "auto" also wants a model of
    REUSE_MIN_PARAMS or more and no optim.micro_batch_size below the batch: the record is freed layer by
    layer only when one micro-batch holds every row; with smaller ones it would be held through all of
    them, more memory than micro-batching saves.
    """
    r, mb = cfg.rollout, cfg.optim.micro_batch_size
    if not r.reuse_activations or cfg.optim.padding_free or world_size != 1 \
            or r.backend not in ("auto", "fast") or r.dynamic_sampling or r.mcts_enabled \
            or cfg.loss.algorithm != "grpo" or checkpointing_enabled(model) \
            or 0 < r.generation_batch_size < cfg.batch_size \
            or is_peft_model(model):   # several decode calls; LoRA: the decoder applies merged weights
        return False
    if compute_dtype(model) is not None:   # bf16: the projection matmuls it saves are the cheap part in bf16,
        return False                       # and _RecordedProjection's backward would run them in fp32
    if r.reuse_activations is True:
        return True
    n_params = sum(p.numel() for p in model.parameters())
    if n_params < REUSE_MIN_PARAMS or 0 < mb < cfg.batch_size:
        return False
    return lambda lengths: reuse_pays(lengths, n_params, cfg.loss.loss_type, cfg.loss.num_iterations)


def reuse_pays(lengths: torch.Tensor, n_params: int, loss_type: str, iterations: int = 1) -> bool:
    """Whether one micro-batch of every row, padded to the longest, at REUSE_COST beats the plain pass's
    micro-batches (length buckets; bnpo: one slice), launch costs included; lengths: prompt + completion [N].
    With mu `iterations`, the micro-batches serve all of them and only the first is reused:

        (REUSE_COST + mu - 1) * (N * max_len + launch)  <  mu * sum_buckets (rows * max_len + launch)
    """
    N = lengths.numel()
    launch = launch_tokens(n_params)
    groups = length_buckets(lengths, N, launch) if loss_type != "bnpo" else [torch.arange(N)]
    plain = sum(float(lengths[g].max()) * len(g) + launch for g in groups)
    return (REUSE_COST + iterations - 1) * (float(lengths.max()) * N + launch) < iterations * plain


def update_plan(state, rollout, groups: list[torch.Tensor], record: ActivationRecord | None
                ) -> tuple[list[torch.Tensor], ActivationRecord | None, bool]:
    """(micro-batches, `record` (the sampler's) to reuse or None, whether that use is its last); groups:
    the plain pass's micro-batches (`grpokit.train.update.micro_batch_plan`).

    "auto" reuses with one micro-batch of every row when `reuse_pays` for the final lengths (else the
    plain pass's length buckets, record dropped); true reuses over the plain micro-batches as they are.
    """
    cfg, N = state.cfg, rollout.completion_ids.shape[0]
    mb = cfg.optim.micro_batch_size or N
    if record is None or not (state.dist.world_size == 1 and record.usable(state.model, rollout)):
        return groups, None, False
    if cfg.rollout.reuse_activations is True:
        return groups, record, len(groups) == 1
    lengths = rollout.prompt_mask.sum(-1) + rollout.completion_mask.sum(-1)           # [N]
    n_params = sum(p.numel() for p in state.model.parameters())
    if mb >= N and reuse_pays(lengths, n_params, cfg.loss.loss_type, cfg.loss.num_iterations):
        return [torch.arange(N)], record, True
    return groups, None, False
