"""The tool loop on a generation engine (rollout.backend=vllm with tools), against a CPU stand-in for vLLM.

The stand-in samples from a copy of the policy with torch, as vLLM would: per request, token-id prompts,
its own max_tokens, stop ids, a seed, the log-prob of each token it drew. With the plain caller (a tiny
model that calls `multiply`), the rollouts have real tool turns; tests/rollout/test_vllm_real.py runs the
same loop on the real engine.
"""

from __future__ import annotations

import json
import threading
from copy import deepcopy

import pytest
import torch
from agent_envs import DiceCalculator
from agent_models import PROMPTS, chat_caller, chat_messages, plain_caller
from transformers import DynamicCache

from grpokit.agents.agent import Agent
from grpokit.agents.builtin import multiply
from grpokit.agents.formats import ChatFormat, PlainFormat
from grpokit.agents.tools import TRUNCATION_MARK
from grpokit.cli.vllm_serve import make_server
from grpokit.config.schema import build_config
from grpokit.errors import ConfigError
from grpokit.model.logprobs import per_token_logprobs
from grpokit.model.shared_prompts import cache_kwarg
from grpokit.rollout.groups import eos_token_ids
from grpokit.rollout.vllm_backend import Sample, ServerEngine, VLLMRollouts, vllm_agent_sampler
from grpokit.tasks.base import Example
from grpokit.train.loop import build_state
from grpokit.train.step import train_step
from grpokit.trl import GRPOConfig, GRPOTrainer

TOOLS = {"rollout.tools": ["grpokit.agents.builtin:multiply"], "rollout.max_completion_length": 120,
         "rollout.backend": "vllm", "rollout.num_generations": 4, "rollout.prompts_per_step": 4,
         "reward.funcs": {"accuracy": 1.0}, "loss.beta": 0.0, "run.progress": False, "model.device": "cpu"}
EXAMPLES = [Example(p, str(eval(p[8:-1])), {"answer": str(eval(p[8:-1]))}) for p in PROMPTS]


class TorchEngine:
    """A `GenerationEngine` sampling from its own copy of the model (KV cache, temperature 1): what vLLM
    does, slowly. Records every request (prompt ids, max_tokens) and stops at spec.stop_token_ids."""

    def __init__(self, model) -> None:
        self.model = deepcopy(model).eval()
        self.requests: list[tuple[list[int], int]] = []
        self.calls: list[str] = []

    @torch.no_grad()
    def _one(self, prompt: list[int], max_tokens: int, stops: set[int], gen: torch.Generator) -> Sample:
        arg = cache_kwarg(self.model)
        out = self.model(torch.tensor([prompt]), use_cache=True,
                         **{arg: DynamicCache(config=self.model.config)})
        ids, lps = [], []
        for _ in range(max_tokens):
            logp = torch.log_softmax(out.logits[0, -1].float(), -1)                  # [V]
            tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
            ids.append(tok)
            lps.append(float(logp[tok]))
            if tok in stops:
                break
            cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
            out = self.model(torch.tensor([[tok]]), use_cache=True, **{arg: cache})
        return Sample(ids, lps)

    def generate(self, prompt_ids, spec, max_tokens=None):
        self.calls.append("generate")
        out = []
        for i, prompt in enumerate(prompt_ids):
            limit = spec.max_tokens if max_tokens is None else max_tokens[i]
            self.requests.append((list(prompt), limit))
            gen = torch.Generator().manual_seed(spec.seed + i)
            out.append([self._one(list(prompt), limit, set(spec.stop_token_ids), gen) for _ in range(spec.n)])
        return out

    def load_weights(self, weights):
        self.calls.append("load_weights")
        self.model.load_state_dict(dict(weights), strict=False)

    def sleep(self):
        self.calls.append("sleep")

    def wake_up(self):
        self.calls.append("wake_up")


def _state(tmp_path, model, tok, **over):
    cfg = build_config({**TOOLS, "run.output_dir": str(tmp_path), **over})
    return build_state(cfg, model, tok, train_examples=EXAMPLES)


def _sample(state, engine, seed: int = 0, examples=EXAMPLES):
    state.rollout_engine = VLLMRollouts(engine, colocate=True)
    torch.manual_seed(seed)
    return state.agent.sample(state.model, state.tokenizer, examples, 4, state.cfg,
                              sampler=vllm_agent_sampler(state))


def test_engine_turns_keep_the_contract_token_in_token_out(tmp_path):
    """The model turns are the engine's tokens with its log-probs (equal to a fresh forward over the whole
    stream), the results are the rendered tokens, every continuation is the row's ids so far."""
    model, tok = plain_caller()
    state = _state(tmp_path, model, tok)
    engine = TorchEngine(model)
    r = _sample(state, engine)
    assert engine.calls[:2] == ["wake_up", "load_weights"] and engine.calls[-1] == "sleep"
    assert sum(len(t.turns) > 1 for t in r.trajectories) >= 8, "the model should call its tool"
    T = r.completion_ids.shape[1]
    full = per_token_logprobs(model, r.input_ids, r.attention_mask, T).detach()
    trained, env = r.loss_mask.bool(), r.completion_mask.bool() & ~r.loss_mask.bool()
    assert env.any() and torch.allclose(r.sampling_logprobs[trained], full[trained], atol=2e-4)
    assert (r.sampling_logprobs[env] == 0).all()
    fmt = PlainFormat(tok, eos_token_ids(model, tok))
    rows = [r.prompt_ids[i][r.prompt_mask[i].bool()].tolist() for i in range(16)]
    for i, traj in enumerate(r.trajectories):
        ids, length = r.completion_ids[i].tolist(), int(r.completion_mask[i].sum())
        for turn in traj.turns:
            assert ids[turn.end:turn.env_end] == (fmt.render(turn.calls) if turn.env_end > turn.end else [])
        assert r.loss_mask[i].sum() == traj.model_tokens and length == traj.model_tokens + traj.env_tokens
        assert traj.stop in ("done", "length")
    assert sum(t.stop == "done" for t in r.trajectories) >= 12
    first, later = engine.requests[:4], engine.requests[4:]
    assert [limit for _, limit in first] == [120] * 4 and later
    for prompt, limit in later:        # some row's prompt ids, then its completion so far, as sampled
        assert any(prompt == rows[i] + r.completion_ids[i, :len(prompt) - len(rows[i])].tolist()
                   and limit == 120 - (len(prompt) - len(rows[i])) for i in range(16)), prompt


def test_engine_turns_apply_the_limits_and_give_errors_to_the_model(tmp_path):
    model, tok = plain_caller()
    r = _sample(_state(tmp_path / "it", model, tok, **{"rollout.max_tool_calling_iterations": 0}),
                TorchEngine(model))
    # no call runs: a row that called stops at "iterations" with its one turn, one that did not (sampling
    # can miss the memorized call on another CPU's rounding) answered ("done") or ran out ("length")
    stops = [t.stop for t in r.trajectories]
    assert stops.count("iterations") >= 8 and set(stops) <= {"iterations", "done", "length"}, stops
    assert all(len(t.turns) == 1 and not any(c.result for c in t.calls) for t in r.trajectories)
    assert r.completion_mask.sum() == r.loss_mask.sum()          # no tool result was inserted
    r = _sample(_state(tmp_path / "len", model, tok, **{"rollout.max_completion_length": 30}),
                TorchEngine(model))
    assert r.completion_ids.shape[1] <= 30 and {"budget", "length"} & {t.stop for t in r.trajectories}
    state = _state(tmp_path / "cut", model, tok, **{"rollout.max_tool_output_chars": 2})
    r = _sample(state, TorchEngine(model))
    calls = [c for t in r.trajectories for c in t.calls if c.error is None]
    assert calls and all(c.truncated and c.result == c.result[:2] + TRUNCATION_MARK for c in calls)

    def multiply(a: int, b: int) -> int:
        """Fails.

        Args:
            a: First.
            b: Second.
        """
        raise ValueError("out of order")

    state = _state(tmp_path / "err", model, tok)
    state.agent = Agent([multiply], None, seed=0)
    r = _sample(state, TorchEngine(model))
    calls = [c for t in r.trajectories for c in t.calls]
    assert all(c.error for c in calls) and sum(c.error == "ValueError: out of order" for c in calls) >= 8
    assert all(t.turns[-1].env_end > t.turns[0].end for t in r.trajectories if t.calls)   # the model read it


def test_chat_turns_on_the_engine_are_the_templates_and_not_prefix_preserving_ones_are_counted(tmp_path):
    """The chat format: tool schemas in the rendered prompt, turns ending at <|im_end|>, results as the
    template's tool messages; a template that drops earlier reasoning: the stream goes on as sampled."""
    for keep in (True, False):
        model, tok = chat_caller(prefix_preserving=keep)
        examples = [Example(chat_messages(ex.prompt), ex.answer, ex.columns) for ex in EXAMPLES]
        state = _state(tmp_path / str(keep), model, tok, **{"rollout.max_completion_length": 200})
        r = _sample(state, TorchEngine(model), examples=examples)
        assert "multiply" in tok.decode(r.prompt_ids[0][r.prompt_mask[0].bool()])     # the schemas
        assert sum(len(t.calls) > 0 for t in r.trajectories) >= 8
        full = per_token_logprobs(model, r.input_ids, r.attention_mask, r.completion_ids.shape[1]).detach()
        trained = r.loss_mask.bool()
        assert torch.allclose(r.sampling_logprobs[trained], full[trained], atol=2e-4)
        fmt = ChatFormat(tok, [tok.eos_token_id])
        for i, traj in enumerate(r.trajectories):
            for turn in traj.turns[:-1]:
                assert r.completion_ids[i, turn.end:turn.env_end].tolist() == fmt.render(turn.calls)
                assert r.completion_ids[i, turn.end - 1] == tok.eos_token_id
            assert traj.non_prefix_turns == (0 if keep else len(traj.turns) - 1)
        assert r.completions[0][0]["role"] == "assistant" and "tool_calls" in r.completions[0][0]


def test_server_mode_gives_the_same_rollout_over_http(tmp_path):
    """Token-id continuations with per-row max_tokens through `grpokit vllm-serve`'s API."""
    model, tok = plain_caller()
    local = _sample(_state(tmp_path / "local", model, tok), TorchEngine(model))
    engine = TorchEngine(model)
    server = make_server(engine, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        state = _state(tmp_path / "server", model, tok, **{"rollout.vllm_mode": "server"})
        state.rollout_engine = VLLMRollouts(ServerEngine(f"http://127.0.0.1:{server.server_address[1]}"),
                                            colocate=False)
        torch.manual_seed(0)
        remote = state.agent.sample(model, tok, EXAMPLES, 4, state.cfg, sampler=vllm_agent_sampler(state))
    finally:
        server.shutdown()
        server.server_close()
    assert torch.equal(local.completion_ids, remote.completion_ids)
    assert torch.equal(local.loss_mask, remote.loss_mask)
    assert torch.allclose(local.sampling_logprobs, remote.sampling_logprobs)
    assert any(limit < 120 for _, limit in engine.requests)       # continuations had their own budgets


def test_a_train_step_on_the_engine_with_tools(tmp_path):
    """rollout.backend=vllm with rollout.tools: accepted, sampled by the engine, trained on model tokens."""
    model, tok = plain_caller()
    state = _state(tmp_path, model, tok, **{"rollout.temperature": 1.0})
    engine = TorchEngine(model)
    state.rollout_engine = VLLMRollouts(engine, colocate=True)
    m = train_step(state)
    assert engine.calls.count("generate") >= 2 and m["turns/mean"] > 1 and m["tokens/env_mean"] > 0
    assert m["mismatch/abs_logprob_diff_max"] < 1e-3                # the engine's log-probs, the policy's own
    with pytest.raises(ConfigError, match="rollout.backend=auto or vllm"):
        build_config({**TOOLS, "rollout.backend": "generate"})


def test_trl_use_vllm_with_tools_and_an_environment_runs_on_the_server(tmp_path):
    """grpokit.trl: GRPOConfig(use_vllm=True, vllm_mode="server") with tools= and environment_factory=, as a
    TRL program writes it; the server's engine samples every turn."""
    model, tok = plain_caller()
    engine = TorchEngine(model)
    server = make_server(engine, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    rows = [{"prompt": p, "answer": str(eval(p[8:-1]))} for p in PROMPTS]
    try:
        agents = (("tools", {"tools": [multiply]}), ("env", {"environment_factory": DiceCalculator}))
        same = dict(num_generations=2, per_device_train_batch_size=4, max_completion_length=120, max_steps=1,
                    report_to="none", bf16=False, learning_rate=1e-3, seed=0)
        for name, agent in agents:
            args = GRPOConfig(output_dir=str(tmp_path / name), use_vllm=True, vllm_mode="server",
                              vllm_server_base_url=url, **same)
            trainer = GRPOTrainer(model, reward_funcs=lambda completions, **kw: [0.5] * len(completions),
                                  args=args, train_dataset=rows, processing_class=tok, **agent)
            assert trainer.config.rollout.backend == "vllm"
            before = engine.calls.count("generate")
            trainer.train()
            assert engine.calls.count("generate") >= before + 2, name     # round 0 and continuations
            metrics = json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[-1])
            assert metrics["turns/mean"] > 1 and metrics["tools/call_frequency"] > 0, name
    finally:
        server.shutdown()
        server.server_close()
