"""One decode loop: a flat group, tool turns (a step-stop driver), a tree and beam rounds all draw their
tokens in `grpokit.rollout.decode_loop.decode`, and no other module draws tokens."""

from pathlib import Path

import grpokit
from grpokit.model.testing import bench_prompts, build_model
from grpokit.rollout import decode_loop, sampler
from grpokit.rollout.groups import render_prompts
from grpokit.rollout.tree import TreeSpec
from grpokit.search.decode import StepStop
from grpokit.search.kept_cache import KeptRows, decode_round


def test_every_way_of_sampling_draws_in_the_one_loop(monkeypatch):
    model, tok = build_model("tiny", mean_length=6)
    ids, mask = render_prompts(tok, bench_prompts(2), None, "left")
    draws: list[int] = []
    real = decode_loop.pick_tokens

    def counted(logits, *a, **k):
        draws.append(logits.shape[0])
        return real(logits, *a, **k)

    monkeypatch.setattr(decode_loop, "pick_tokens", counted)
    kw = dict(temperature=1.0, top_p=1.0, top_k=0, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id)
    seen = []
    for extra in ({}, {"tree": TreeSpec((2, 2), (3,))},
                  {"driver": StepStop(tok, [tok.eos_token_id], " ", [9] * 8, len(tok))}):
        draws.clear()
        tokens, _ = sampler.fast_sample(model, ids, mask, 4, 12, **kw, **extra)
        seen.append((len(draws), tokens.shape[1]))
    rows = KeptRows(model, ids[0].tolist(), 3, 8)
    draws.clear()
    steps = decode_round(rows, rows.first.expand(3, -1), [2, 5, 3], lambda i: False, temperature=1.0,
                         top_p=1.0, top_k=0)
    seen.append((len(draws), max(len(s) for s, _ in steps)))
    assert all(n == columns > 0 for n, columns in seen), seen    # one draw per column, in the one loop


def test_no_other_module_draws_tokens():
    src = Path(grpokit.__file__).parent
    drawers = sorted(str(p.relative_to(src)) for p in src.rglob("*.py")
                     if "pick_tokens(" in p.read_text() and p.name != "sampling.py")
    assert drawers == ["rollout/decode_loop.py"], drawers
