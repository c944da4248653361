"""The tool loop on a generation engine (rollout.backend=vllm with rollout.tools / rollout.environment).

vLLM samples; grpokit's `ToolDriver` (grpokit.agents.driver, the one the built-in decode loop consults:
where a turn ends, the parsing, the tools, the limits) decides what happens between turns. The loop runs
in rounds, each one `engine.generate` call over the rows still going:

    round 0   one request per prompt, n = G (the G rows share its prefill), max_tokens = the budget T
    round k   one request per row that goes on (n = 1): its prompt is the row's token ids so far, prompt +
              completion (the model's tokens as sampled, the results as rendered: token ids, nothing is
              re-tokenized), max_tokens = what is left of the budget

Every request stops at the format's stop ids (EOS, and for the plain format any token that may close
</tool_call>). After a round, the rows that stopped at one go to `ToolDriver.end_turns` together, so the
tools of all of them run concurrently; a row whose call ran gets its result tokens appended and goes on
in the next round; a stop id that did not end a turn (a '>' inside the text) just continues the turn;
a row that reached its budget, or whose trajectory ended, is done. Within a round vLLM batches the rows
and each advances on its own (continuous batching); a row's tools run once the round's generate call
has returned (the built-in loop's batch waits for its tools the same way).

Each request carries its own seed (the step's seed, offset by round and position), so a run is
reproducible given its seed, as in single-turn vLLM rollouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from grpokit.rollout.turns import TurnDriver
from grpokit.rollout.vllm_engine import GenerationEngine, SamplingSpec


def sample_turns(engine: GenerationEngine, driver: TurnDriver, prompt_rows: Sequence[list[int]],
                 group_size: int, spec: SamplingSpec) -> tuple[list[list[int]], list[list[float]]]:
    """G multi-turn completions for each prompt.

    Args:
        engine: the generation engine (vLLM in this process, the `grpokit vllm-serve` client, a stand-in).
        driver: the N = len(prompt_rows) * G rows' tool loop (`begin` already called with their prompts).
        prompt_rows: the prompts' token ids (no padding).
        group_size: G rows per prompt.
        spec: the sampling (spec.n is ignored; spec.max_tokens is the completion budget T, model and
            environment tokens together; spec.stop_token_ids the EOS ids).

    Returns:
        (completion ids, sampling log-probs) per row: the model's tokens with vLLM's log-probs, the inserted
        result tokens with 0. The driver's trajectories say where each turn starts and ends.
    """
    N, budget = len(prompt_rows) * group_size, spec.max_tokens
    stops = set(map(int, driver.stop_ids.tolist())) | set(spec.stop_token_ids)
    spec = replace(spec, stop_token_ids=tuple(sorted(stops)))
    ids: list[list[int]] = [[] for _ in range(N)]
    lps: list[list[float]] = [[] for _ in range(N)]
    groups = engine.generate(list(prompt_rows), replace(spec, n=group_size))
    got = {i * group_size + j: s for i, group in enumerate(groups) for j, s in enumerate(group)}
    rounds = 0
    while got:
        stopped = {}
        for g in sorted(got):
            ids[g] += got[g].token_ids
            lps[g] += got[g].logprobs
            if got[g].token_ids and got[g].token_ids[-1] in stops:
                stopped[g] = ids[g]
        feed, ended = driver.end_turns(stopped)
        for g, env in feed.items():
            ids[g] += env
            lps[g] += [0.0] * len(env)
        done = set(ended)
        going = [g for g in stopped if g not in done and len(ids[g]) < budget]
        if not going:
            break
        rounds += 1
        seed = None if spec.seed is None else spec.seed + rounds * N
        out = engine.generate([list(prompt_rows[g // group_size]) + ids[g] for g in going],
                              replace(spec, n=1, seed=seed), max_tokens=[budget - len(ids[g]) for g in going])
        got = {g: group[0] for g, group in zip(going, out)}
    for g in range(N):
        driver.close(g, ids[g])
    return ids, lps
