"""The multi-turn trajectory contract: the stream as sampled, env tokens attended and never trained."""

from __future__ import annotations

import pytest
import torch
from agent_models import PROMPTS, plain_caller

from grpokit import switch
from grpokit.agents.agent import Agent, agent_from_config
from grpokit.agents.formats import PlainFormat
from grpokit.config.schema import build_config
from grpokit.core.loss import grpo_objective_from_logprobs
from grpokit.model.logprobs import per_token_logprobs
from grpokit.rollout.groups import eos_token_ids
from grpokit.tasks.base import Example
from grpokit.train.update import grpo_loss

TOOLS = {"rollout.tools": ["grpokit.agents.builtin:multiply"], "rollout.max_completion_length": 120,
         "model.device": "cpu"}


def multi_turn(seed: int = 0, engine: str = "lean", **over):
    """A multi-turn rollout of the plain caller. engine: lean (the readable decoder), accelerated (the
    training path: grpokit's C kernels where they build) or cached (transformers' forward and DynamicCache,
    which any forward hook selects)."""
    model, tok = plain_caller()
    cfg = build_config({**TOOLS, **over})
    torch.manual_seed(seed)
    examples = [Example(p, "", {}) for p in PROMPTS]
    hook = model.model.norm.register_forward_hook(lambda *a: None) if engine == "cached" else None
    with switch.accelerated(model, cfg) if engine == "accelerated" else switch.plain():
        rollout = agent_from_config(cfg).sample(model, tok, examples, 4, cfg)
    if hook is not None:
        hook.remove()
    assert sum(len(t.turns) > 1 for t in rollout.trajectories) >= 4, "the model should call its tool"
    return model, tok, rollout


@pytest.mark.parametrize("engine", ["lean", "accelerated", "cached"])
def test_sampling_logprobs_equal_a_full_forward_over_the_whole_stream(engine):
    """Each sampled token's log-prob, computed while decoding (its KV cache holding the earlier turns and the
    fed tool results), equals a fresh forward over prompt + completion: the ids trained are the ids sampled,
    and the results went into the row's cache at the right positions."""
    model, _, r = multi_turn(engine=engine)
    T = r.completion_ids.shape[1]
    with torch.no_grad():
        full = per_token_logprobs(model, r.input_ids, r.attention_mask, T)
    trained = r.loss_mask.bool()
    env = r.completion_mask.bool() & ~trained
    assert env.any() and trained.any()
    assert torch.allclose(r.sampling_logprobs[trained], full[trained], atol=2e-4)
    assert (r.sampling_logprobs[env] == 0).all()


def test_the_stream_is_model_turns_then_the_rendered_results():
    model, tok, r = multi_turn()
    fmt = PlainFormat(tok, eos_token_ids(model, tok))
    for i, traj in enumerate(r.trajectories):
        ids = r.completion_ids[i]
        stream, model_cols = [], []
        for turn in traj.turns:
            stream += ids[turn.start:turn.end].tolist()
            model_cols += list(range(turn.start, turn.end))
            if turn.env_end > turn.end:
                assert ids[turn.end:turn.env_end].tolist() == fmt.render(turn.calls)
                stream += fmt.render(turn.calls)
        length = int(r.completion_mask[i].sum())
        assert stream == ids[:length].tolist()
        assert r.loss_mask[i].nonzero().squeeze(-1).tolist() == model_cols
        assert (ids[length:] == tok.pad_token_id).all()
        text = tok.decode(ids[:length].tolist(), skip_special_tokens=True)
        assert r.completions[i] == text     # text prompts: the completion is the whole stream as text


def test_a_rollout_with_tools_is_reproducible_whatever_the_tools_latency():
    """Which rows sample at each step depends on the tokens only, not on when a tool answers."""
    import random
    import time

    def slow_multiply(a: int, b: int) -> int:
        """Multiply, after a random pause.

        Args:
            a: First.
            b: Second.
        """
        time.sleep(random.random() * 0.02)
        return a * b

    model, tok = plain_caller()
    cfg = build_config(TOOLS)
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        agent = Agent([slow_multiply], None, seed=0)
        r = agent.sample(model, tok, [Example(p, "", {}) for p in PROMPTS], 4, cfg)
        runs.append(r)
    assert torch.equal(runs[0].completion_ids, runs[1].completion_ids)
    assert torch.equal(runs[0].sampling_logprobs, runs[1].sampling_logprobs)
    assert [len(t.calls) for t in runs[0].trajectories] == [len(t.calls) for t in runs[1].trajectories]


def test_environment_tokens_get_no_gradient():
    """d loss / d log-prob is exactly 0 at every environment token, and garbage in their old log-probs and
    per-token advantages changes no gradient; yet they are attended: changing one changes the gradient."""
    model, _, r = multi_turn()
    T = r.completion_ids.shape[1]
    env = (r.completion_mask.bool() & ~r.loss_mask.bool())
    new = per_token_logprobs(model, r.input_ids, r.attention_mask, T)
    new.retain_grad()
    adv = torch.linspace(-1, 1, r.completion_ids.shape[0])
    loss, _ = grpo_objective_from_logprobs(new, None, None, r.loss_mask.float(), adv, 0.2, 0.0)
    loss.backward()
    assert (new.grad[env] == 0).all() and new.grad[r.loss_mask.bool()].abs().sum() > 0

    def grads(old, advantages, rollout=r):
        model.zero_grad()
        loss, _ = grpo_loss(model, rollout, advantages, old_logprobs=old, kl_coef=0.0)
        loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    old = r.sampling_logprobs.clone()
    per_token = adv[:, None].expand(-1, T).clone()
    base = grads(old, per_token)
    noisy = grads(old + 7.0 * env, per_token + 5.0 * env)
    assert all(torch.equal(a, b) for a, b in zip(base, noisy))
    row, col = env.nonzero()[0].tolist()           # attended: another env token changes later logits
    changed = r.select(list(range(r.completion_ids.shape[0])))
    changed.completion_ids = r.completion_ids.clone()
    changed.completion_ids[row, col] = (r.completion_ids[row, col] + 1) % 90 + 4
    moved = grads(old, per_token, rollout=changed)
    assert not all(torch.equal(a, b) for a, b in zip(base, moved))


def test_a_train_step_with_tools_trains_only_model_tokens_and_logs_turns(tmp_path):
    from grpokit.train.loop import build_state
    from grpokit.train.step import train_step

    model, tok = plain_caller()
    cfg = build_config({**TOOLS, "reward.funcs": {"accuracy": 1.0}, "rollout.num_generations": 4,
                        "rollout.prompts_per_step": 2, "run.output_dir": str(tmp_path), "loss.beta": 0.0,
                        "rollout.temperature": 1.3})
    examples = [Example(p, str(eval(p[8:-1])), {"answer": str(eval(p[8:-1]))}) for p in PROMPTS]
    state = build_state(cfg, model, tok, train_examples=examples)
    metrics = train_step(state)
    for key in ("turns/mean", "tools/call_frequency", "tools/failure_frequency", "tokens/model_mean",
                "tokens/env_mean", "cut/budget", "turns/non_prefix"):
        assert key in metrics, key
    assert metrics["turns/mean"] > 1 and metrics["tokens/env_mean"] > 0
    assert torch.isfinite(torch.tensor(metrics["loss"]))


def test_the_sampler_activation_record_serves_a_multi_turn_update(tmp_path):
    """rollout.reuse_activations=true: the first update takes the projections the sampler computed, fed
    tokens included; the step's loss and gradient norm match the plain forward's to float rounding."""
    from grpokit.train.loop import build_state
    from grpokit.train.step import train_step

    out = {}
    for reuse in (False, True):
        model, tok = plain_caller()
        cfg = build_config({**TOOLS, "reward.funcs": {"accuracy": 1.0}, "rollout.num_generations": 4,
                            "rollout.prompts_per_step": 2, "run.output_dir": str(tmp_path / str(reuse)),
                            "loss.beta": 0.0, "rollout.temperature": 1.3, "rollout.reuse_activations": reuse})
        examples = [Example(p, str(eval(p[8:-1])), {"answer": str(eval(p[8:-1]))}) for p in PROMPTS]
        state = build_state(cfg, model, tok, train_examples=examples)
        torch.manual_seed(1)
        out[reuse] = train_step(state)
    assert out[True]["turns/mean"] == out[False]["turns/mean"] > 1
    assert abs(out[True]["loss"] - out[False]["loss"]) < 1e-5
    assert abs(out[True]["grad_norm"] - out[False]["grad_norm"]) < 1e-4 * max(1.0, out[False]["grad_norm"])
