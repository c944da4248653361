"""Pure tensor math, no model and no config: what the chapter's formulas compute.

    advantages  [C] group-relative advantages (outcome and process supervision)
    loss        [E-F] the per-token clipped objective, the k3 KL, the loss aggregations
    ppo         the PPO baseline's GAE, whitening and clipped value loss

Importing this package pulls in torch and nothing else of grpokit's (tests/test_imports.py checks it).
"""
