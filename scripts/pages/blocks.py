"""Every generated block of README.md and docs/*.md, page module by page module "
"(scripts/pages/__init__.py)."""

from . import (
    agents,
    asynchronous,
    code,
    experiments,
    gains,
    memory,
    performance,
    precision,
    qlora,
    race,
    ragged,
    readme,
    real_model,
    reliability,
    reward_models,
    search,
    vllm,
)

PAGES = (
    readme, experiments, reward_models, memory, qlora, performance, ragged, gains, precision, race,
    real_model, search, asynchronous, agents, vllm, reliability, code,
)
BLOCKS = [block for page in PAGES for block in page.BLOCKS]
