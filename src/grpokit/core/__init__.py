"""Pure tensor math, no model and no config: what the chapter's formulas compute.

    advantages  [C] group-relative advantages (outcome and process supervision)
    loss        [E-F] the per-token objective, the k3 KL, the loss aggregations, the sampler IS weights
    policy_terms  [E] each loss type's policy term (clip family, CISPO, SAPO, VESPO)
    token_masks   [E] the high-entropy token mask and the off-policy sequence mask
    entropy     the entropy bonus and its adaptive coefficient
    ppo         the PPO baseline's GAE, whitening and clipped value loss

Importing this package pulls in torch and nothing else of grpokit's (tests/test_imports.py checks it).
"""
