"""[B] Rewards: rule-based checks, code run in a sandbox, reward-function calls, and learned reward models.

    scoring     rule_reward, score_responses (the weighted sum), the built-in reward functions
    answers     final-answer extraction and comparison (\boxed{}, numbers, math-verify)
    calls       calling user reward functions (TRL's signature) and checking what they return
    steps       the arithmetic step verifier (rule-based process reward, section 4.1.3)
    shaping     DAPO's soft overlong punishment and the step verifier as reward functions
    code        code rewards: each completion's program run against its tests in grpokit.sandbox
    outcome_rm  a learned outcome reward model as a reward function
    process_rm  a learned process reward model: one score per reasoning step
    rm_text     what a reward model reads; rm_batch: batched scoring; rm_data: labeled samples;
    rm_train    training and evaluating reward models (Algorithm 1's continual training uses it)
"""
