"""grpokit.rollout.vllm_backend against the rollout contract, with a CPU stand-in for vLLM (no GPU here).

The stand-in returns known tokens and log-probs: its log-probs are the trainer's own minus a known
shift delta per position, so the truncated importance weights min(exp(delta), cap) are known by hand.
"""

import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from grpokit.cli.vllm_serve import make_server
from grpokit.config.schema import build_config
from grpokit.core.loss import grpo_objective_from_logprobs, truncated_is_weights
from grpokit.model.logprobs import per_token_logprobs
from grpokit.rollout.vllm_backend import (
    Sample,
    SamplingSpec,
    ServerEngine,
    VLLMRollouts,
    rollout_from_samples,
    vllm_sample,
)
from grpokit.rollout.vllm_engine import policy_weights

EASY = str(Path(__file__).resolve().parents[1] / "easy_rewards.py") + ":share_of_a"
# shift of the stand-in's log-prob at even / odd positions: weights e^0.5, min(e^1, 2) = 2
DELTA = (0.5, 1.0)


@dataclass
class Ex:
    prompt: str
    answer: str = ""
    columns: dict = field(default_factory=dict)


class StandInEngine:
    """Known completions (sample j: 'a' * (j + 1) then EOS for even j; for odd j, 'a' up to max_tokens
    with no EOS, as a real engine stops only there); log-probs are the
    model's own per_token_logprobs minus DELTA, so pi_old / pi_sampler = exp(DELTA) exactly."""

    def __init__(self, model, eos_id: int, a_id: int):
        self.model, self.eos_id, self.a_id = model, eos_id, a_id
        self.calls: list[str] = []
        self.loaded: dict[str, torch.Tensor] = {}

    def generate(self, prompt_ids, spec: SamplingSpec):
        self.calls.append("generate")
        out = []
        for ids in prompt_ids:
            group = []
            for j in range(spec.n):
                toks = [self.a_id] * (j + 1) + [self.eos_id] if j % 2 == 0 else [self.a_id] * spec.max_tokens
                full = torch.tensor([list(ids) + toks])
                with torch.no_grad():
                    lp = per_token_logprobs(self.model, full, torch.ones_like(full), len(toks),
                                            temperature=spec.temperature)[0]
                shift = torch.tensor([DELTA[t % 2] for t in range(len(toks))])
                group.append(Sample(toks, (lp - shift).tolist()))
            out.append(group)
        return out

    def load_weights(self, weights):
        self.calls.append("load_weights")
        part = {k: v.clone() for k, v in weights}
        self.loaded.update(part)                                  # as vLLM, each call loads the names given
        self.model.load_state_dict(part, strict=False)

    def sleep(self):
        self.calls.append("sleep")

    def wake_up(self):
        self.calls.append("wake_up")


def test_truncated_is_weights_by_hand():
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, 0.0]])
    samp = torch.tensor([[-1.5, -1.0, -0.5], [-2.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    w, m = truncated_is_weights(old, samp, mask, "token", cap=1.5)
    # log ratios 0.5, -1, 0 | 1, 0, (masked): weights e^.5=1.6487->1.5 (capped), e^-1, 1 | e^1->1.5, 1, 1
    expect = torch.tensor([[1.5, math.exp(-1.0), 1.0], [1.5, 1.0, 1.0]])
    assert torch.allclose(w, expect)
    assert float(m["tis/mean_weight"]) == pytest.approx((1.5 + math.exp(-1) + 1 + 1.5 + 1) / 5)
    assert float(m["tis/clipped_frac"]) == pytest.approx(2 / 5)
    w, m = truncated_is_weights(old, samp, mask, "sequence", cap=3.0)
    # sums of log ratios: -0.5 and 1.0 -> e^-0.5 and e^1 (under the cap 3)
    assert torch.allclose(w, torch.tensor([[math.exp(-0.5)], [math.e]]))
    assert float(m["tis/clipped_frac"]) == 0.0


def test_weights_scale_the_policy_gradient_of_each_token():
    new = torch.tensor([[-1.0, -2.0, -0.7]], requires_grad=True)
    mask, adv = torch.ones(1, 3), torch.tensor([2.0])
    w = torch.tensor([[0.5, 2.0, 1.0]])
    loss, _ = grpo_objective_from_logprobs(new, None, None, mask, adv, 0.2, 0.0,
                                           loss_type="dapo", tis_weights=w)
    loss.backward()
    # ratio 1 at old = new: d(-w * r * A / 3)/d new_t = -w_t * A / 3
    assert torch.allclose(new.grad, -w * 2.0 / 3)


def _state(tmp_path, char_tokenizer, tiny_model, **over):
    from grpokit.train.loop import build_state
    values = {"model.name_or_path": "builtin:tiny-random", "reward.funcs": {EASY: 1.0},
              "rollout.backend": "vllm", "rollout.prompts_per_step": 2, "rollout.num_generations": 4,
              "rollout.max_completion_length": 6, "loss.tis_cap": 2.0, "run.output_dir": str(tmp_path),
              "run.progress": False, "loss.beta": 0.0}
    values.update(over)
    return build_state(build_config(values), tiny_model, char_tokenizer,
                       train_examples=[Ex("Say a:"), Ex("Go:"), Ex("Now:"), Ex("Type:")])


def _engine(state):
    from copy import deepcopy

    tok = state.tokenizer
    return StandInEngine(deepcopy(state.model), tok.eos_token_id,
                         tok("a", add_special_tokens=False)["input_ids"][0])


def test_colocated_rollout_keeps_the_contract_and_the_sampler_logprobs(tmp_path, char_tokenizer, tiny_model):
    state = _state(tmp_path, char_tokenizer, tiny_model)
    engine = _engine(state)
    state.rollout_engine = VLLMRollouts(engine, colocate=True)
    r = vllm_sample(state, ["Say a:", "Go:"])
    N, G = 8, 4
    assert r.completion_ids.shape[0] == N and r.group_size == G and r.group_ids.tolist() == [0] * 4 + [1] * 4
    assert r.completion_mask.sum(-1).tolist() == [2, 6, 4, 6] * 2                 # up to and incl. EOS
    assert r.truncated.tolist() == [False, True, False, True] * 2
    assert r.completions[0] == "a" and r.completions[3] == "aaaaaa" and r.prompts[4] == "Go:"
    assert r.sampling_logprobs.shape == r.completion_ids.shape
    assert torch.all(r.sampling_logprobs[r.completion_mask == 0] == 0)
    # what the trainer recomputes minus the known shift
    lp = per_token_logprobs(state.model, r.input_ids, r.attention_mask, r.completion_ids.shape[1])
    shift = torch.tensor([DELTA[t % 2] for t in range(r.completion_ids.shape[1])])
    assert torch.allclose((lp - shift) * r.completion_mask, r.sampling_logprobs, atol=1e-5)
    assert engine.calls == ["wake_up", "load_weights", "generate", "sleep"]       # weights of step 0 pushed
    vllm_sample(state, ["Now:"])
    assert engine.calls[4:] == ["wake_up", "generate", "sleep"]                   # same step: no second push


def test_train_step_corrects_the_mismatch_with_known_weights(tmp_path, char_tokenizer, tiny_model):
    from grpokit.train.step import train_step
    for level, expect_w, expect_clip in (("token", None, None), ("sequence", None, None)):
        state = _state(tmp_path / level, char_tokenizer, tiny_model, **{"loss.tis_level": level})
        engine = _engine(state)
        state.rollout_engine = VLLMRollouts(engine, colocate=True)
        m = train_step(state)
        lengths = [2, 6, 4, 6] * 2                                 # completion tokens per row (see above)
        if level == "token":   # even positions e^0.5 = 1.6487, odd positions e^1 -> capped at 2
            per_row = [[math.exp(0.5) if t % 2 == 0 else 2.0 for t in range(n)] for n in lengths]
            w = sum(map(sum, per_row)) / sum(lengths)
            clipped = sum(n // 2 for n in lengths) / sum(lengths)
        else:                  # exp(sum of shifts) >= e^1.5 = 4.48 for every row: all capped at 2
            w, clipped = 2.0, 1.0
        assert m["tis/mean_weight"] == pytest.approx(w, rel=1e-4), level
        assert m["tis/clipped_frac"] == pytest.approx(clipped, rel=1e-4), level
        assert math.isfinite(m["loss"]) and m["completion_tokens"] == sum(lengths)
        # the measured mismatch |logp_old - logp_sampler| is the stand-in's shift: 0.5 / 1.0 by position
        shifts = sum(DELTA[t % 2] for n in lengths for t in range(n))
        assert m["mismatch/abs_logprob_diff_mean"] == pytest.approx(shifts / sum(lengths), rel=1e-4)
        assert m["mismatch/abs_logprob_diff_max"] == pytest.approx(1.0, rel=1e-4)
        train_step(state)                                          # step 1: the updated weights are pushed
        assert engine.calls.count("load_weights") == 2
        for k, v in policy_weights(state.model):
            assert torch.equal(engine.loaded[k], v), k


def test_server_mode_over_http(tmp_path, char_tokenizer, tiny_model):
    state = _state(tmp_path, char_tokenizer, tiny_model, **{"rollout.vllm_mode": "server"})
    engine = _engine(state)
    server = make_server(engine, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = ServerEngine(f"http://127.0.0.1:{server.server_address[1]}")
        state.rollout_engine = VLLMRollouts(client, colocate=False)
        r = vllm_sample(state, ["Say a:", "Go:"])
        assert r.completion_mask.sum(-1).tolist() == [2, 6, 4, 6] * 2
        for k, v in policy_weights(state.model):               # pushed as safetensors, received intact
            assert torch.equal(engine.loaded[k], v), k
        # loaded layer by layer, then sampled; the server's GPU is never put to sleep
        assert set(engine.calls[:-1]) == {"load_weights"} and engine.calls[-1] == "generate"
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ConnectionError, match="grpokit vllm-serve"):
        ServerEngine(f"http://127.0.0.1:{server.server_address[1]}",
                     timeout=2).generate([[1]], SamplingSpec(2, 3))


def test_server_weights_go_tensor_by_tensor_and_reach_the_engine_as_whole_layers(tmp_path, char_tokenizer,
                                                                                  tiny_model, monkeypatch):
    """One HTTP body per tensor (the client never holds more than one tensor's copy); the server stages a
    decoder layer's tensors and hands the engine each layer whole: vLLM reloads a layer that arrives in part
    with its missing part uninitialized (a fused qkv_proj sent as q in one call, k and v in the next)."""
    import grpokit.rollout.vllm_backend as backend

    state = _state(tmp_path, char_tokenizer, tiny_model, **{"rollout.vllm_mode": "server"})
    engine = _engine(state)
    calls: list[list[str]] = []
    load = engine.load_weights
    engine.load_weights = lambda weights: (calls.append([k for k, _ in weights]), load(weights))
    bodies: list[str] = []
    post = ServerEngine._post
    monkeypatch.setattr(ServerEngine, "_post", lambda self, path, body, kind="application/json":
                        (bodies.append(path), post(self, path, body, kind))[1])
    weights = list(policy_weights(state.model))
    groups = list(dict.fromkeys(backend.weight_group(k) for k, _ in weights))
    assert sum(".layers." in g for g in groups) >= 2 and len(groups) > 3
    server = make_server(engine, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        ServerEngine(f"http://127.0.0.1:{server.server_address[1]}").load_weights(weights)
    finally:
        server.shutdown()
        server.server_close()
    assert len(bodies) == len(weights)                                  # one body per tensor
    assert bodies.count("/load_weights") == len(groups)                 # each group's last tensor
    assert [sorted({backend.weight_group(k) for k in c}) for c in calls] == [[g] for g in groups]
    assert [k for c in calls for k in c] == [k for k, _ in weights]    # each layer whole, in order
    assert all(torch.equal(engine.loaded[k], v) for k, v in weights)
    split = list(backend.with_group_ends([("model.layers.0.a", 0), ("model.layers.0.b", 0),
                                          ("model.layers.1.a", 0), ("lm_head.weight", 0)]))
    assert [last for _, _, last in split] == [False, True, True, True]


def test_rollout_from_samples_rejects_a_wrong_group_size(char_tokenizer):
    ids, mask = torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="expected 2 each"):
        rollout_from_samples(char_tokenizer, ["x"], ids, mask, [[Sample([1], [0.0])]], 2,
                             [char_tokenizer.eos_token_id])


def test_missing_vllm_is_one_line(tmp_path, char_tokenizer, tiny_model):
    state = _state(tmp_path, char_tokenizer, tiny_model)
    with pytest.raises(ImportError, match="pip install 'grpokit\\[vllm\\]'"):
        vllm_sample(state, ["Go:"])


def test_server_token_is_checked_and_sent(tmp_path, char_tokenizer, tiny_model, monkeypatch):
    """With --token, a request without it or with a wrong one gets 401 (the client raises PermissionError
    naming the variable); the trainer's client sends $GRPOKIT_SERVE_TOKEN and is served."""
    import urllib.error
    import urllib.request

    from grpokit.serve_auth import TOKEN_ENV

    state = _state(tmp_path, char_tokenizer, tiny_model, **{"rollout.vllm_mode": "server"})
    engine = _engine(state)
    server = make_server(engine, "127.0.0.1", 0, token="s3cret-token")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-token"}):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(urllib.request.Request(url + "/health", headers=headers), timeout=5)
            assert e.value.code == 401, headers
        monkeypatch.delenv(TOKEN_ENV, raising=False)
        with pytest.raises(PermissionError, match=TOKEN_ENV):
            ServerEngine(url, timeout=5).load_weights(list(policy_weights(state.model))[:1])
        assert engine.calls == []                                   # nothing reached the engine
        monkeypatch.setenv(TOKEN_ENV, "s3cret-token")
        state.rollout_engine = VLLMRollouts(ServerEngine(url, timeout=30), colocate=False)
        r = vllm_sample(state, ["Say a:", "Go:"])
        assert r.completion_mask.sum(-1).tolist() == [2, 6, 4, 6] * 2
        assert engine.calls[-1] == "generate"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.7", "example.org"])
def test_server_refuses_to_listen_beyond_loopback_without_a_token(host, monkeypatch):
    from grpokit.cli.vllm_serve import main
    from grpokit.serve_auth import TOKEN_ENV, is_loopback

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(ValueError, match="--token"):
        make_server(object(), host, 0)
    # the command refuses before vLLM is imported or started (exit 2, one line)
    assert main(["--model", "no-such-folder", "--host", host]) == 2
    assert not is_loopback(host)
    assert all(is_loopback(h) for h in ("127.0.0.1", "localhost", "::1", "[::1]", "127.8.0.1",
                                        "::ffff:127.0.0.1"))


def test_serve_token_compare_and_redaction():
    from grpokit.serve_auth import authorized, redacted, resolve_token

    assert authorized("Bearer abc", "abc") and authorized("bearer abc ", "abc")
    assert not authorized("Bearer abd", "abc") and not authorized(None, "abc")
    assert not authorized("abc", "abc")                             # no scheme
    assert authorized(None, "")                                    # no token: loopback only, anything goes
    assert resolve_token(None, {"GRPOKIT_SERVE_TOKEN": " t "}) == "t" and resolve_token("x", {}) == "x"
    assert "abc" not in redacted("abc") and redacted("") == "none"


def test_the_client_waits_for_the_server_then_says_what_to_do(tmp_path, char_tokenizer, tiny_model):
    """rollout.vllm_server_timeout_s (TRL's vllm_server_timeout): /health polled until the server answers."""
    import time

    state = _state(tmp_path, char_tokenizer, tiny_model, **{"rollout.vllm_mode": "server"})
    server = make_server(_engine(state), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        client = ServerEngine(url)
        assert client.wait_ready(5) is client
    finally:
        server.shutdown()
        server.server_close()
    start = time.monotonic()
    with pytest.raises(ConnectionError, match="within 1.5 s .rollout.vllm_server_timeout_s."):
        ServerEngine(url).wait_ready(1.5)
    assert 1.4 <= time.monotonic() - start < 10


def test_colocated_engine_gets_max_model_length_and_sleep_mode(tmp_path, char_tokenizer, tiny_model,
                                                                monkeypatch):
    """TRL's vllm_max_model_length / vllm_enable_sleep_mode -> rollout.* -> the colocated VLLMEngine."""
    import grpokit.rollout.vllm_backend as backend

    seen = []
    monkeypatch.setattr(backend, "require_vllm", lambda: None)
    monkeypatch.setattr(backend, "VLLMEngine", lambda folder, **kw: seen.append(kw) or object())
    for over, want in (({}, (518, True)),
                       ({"rollout.vllm_max_model_length": 2048, "rollout.vllm_enable_sleep_mode": False},
                        (2048, False))):
        backend.build_rollouts(_state(tmp_path / str(len(seen)), char_tokenizer, tiny_model, **over))
        assert (seen[-1]["max_model_len"], seen[-1]["sleep_mode"]) == want
    with pytest.raises(ValueError, match="vllm_max_model_length=100 is shorter than"):
        build_config({"rollout.backend": "vllm", "rollout.vllm_max_model_length": 100})
