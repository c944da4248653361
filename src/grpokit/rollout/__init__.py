"""[A] Sampling G completions per prompt, and the `Rollout` contract between sampling and update.

    groups        sample_groups, Rollout (ids, attention and loss masks), prompt encoding
    trajectory    a multi-turn sample's record: its turns (completion columns), tool calls, why it ended
    decode_loop   the one decode loop (draw, write, drop finished rows, step); its rows objects say what
                  differs: one turn, tool turns (turns), a tree (tree), beam rounds (search.kept_cache)
    turns         tool turns in that loop: rows stop at tool calls and are fed the results
    sampler       grpokit's own KV-cache engines behind it (rollout.backend=fast); its C kernels come from
                  the one switch's scope (grpokit.model.speedups)
    decode_linear the decode loop's matmuls (weights packed once per call for oneDNN)
    cached_engine the decode loop's engine for other architectures (a transformers DynamicCache)
    sampling      the token draw: temperature, top-k, top-p, exactly `generate`'s distribution
    tree          tree rollouts: a group's leaves share prefixes, decoded once, the KV cache forked
    vllm_backend  the same Rollout from a vLLM engine (rollout.backend=vllm)
    vllm_engine   the engine contract, and the real vLLM engine behind it
    async_worker  rollout.async's worker process: samples batches with the weights it was sent
    vllm_turns    the tool loop on an engine: rounds of generate calls on each row's token ids so far
"""
