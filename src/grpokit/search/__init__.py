"""Search at inference: spend more decoding on a problem for a better single answer.

    grpokit eval --search majority --budget 8
    grpokit eval --search best-of-n --budget 8 --rm runs/rm
    grpokit eval --search beam --budget 4 --prm runs/prm --expand 2
    grpokit eval --search mcts --budget 8 --prm steps --step-separator ". "

    common     Completion, ProblemResult, answer keys, correctness, SearchError
    decode     Decoder: whole completions (sample_groups) and one-step continuations (beam, mcts)
    scorers    outcome RM, process RM (min / last of the step scores), the step verifier (`--prm steps`)
    greedy     one argmax completion (the baseline row)
    majority   self-consistency: the most frequent final answer of N samples
    best_of_n  the top-scored of N samples
    beam       step-level beam search guided by a process scorer
    kept_cache a problem's beams as rows of one KV cache kept across rounds (prompt prefilled once)
    mcts       Monte Carlo tree search over steps (UCT), values from scored rollouts
    mcts_batch the same search for B prompts in lockstep, every simulation's trajectory kept with its
               sampling log-probs: MCTS rollouts for training (grpokit.train.mcts_rollouts)
    run        SearchSpec (the flags and their checks) and search_evaluate (the report)

Each method reports accuracy, generated tokens per problem (every token decoded, discarded ones too)
and wall seconds. See docs/search.md.
"""
