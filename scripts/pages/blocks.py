"""Every generated block of README.md and docs/*.md, page module by page module "
"(scripts/pages/__init__.py)."""

from . import (
    agents,
    asynchronous,
    code,
    experiments,
    gains,
    long,
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
    threads,
    vllm,
)

PAGES = (
    readme, experiments, reward_models, memory, qlora, long, performance, ragged, gains, precision, race,
    real_model, threads, search, asynchronous, agents, vllm, reliability, code,
)
BLOCKS = [block for page in PAGES for block in page.BLOCKS]
