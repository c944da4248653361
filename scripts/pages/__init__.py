"""Every generated block of README.md and docs/*.md, each a spec (render.py) beside its page's others:

    readme.py       README.md's demo output and headline table (docs/index.md's too), docs/demo.md's seeds
    experiments.py  experiments.md: the sweeps' tables and the chapter's claims, each verdict computed
    reward_models.py, memory.py, performance.py, precision.py, vllm.py, agents.py, search.py: their pages
    gains.py        performance.md's speed-up gains, natural lengths and prompt cache
    code.py         code.md: the hostile programs and the sandbox pool's throughput
    asynchronous.py async.md        race.py, real_model.py: real_model.md (SmolLM2)
    reliability.py  reliability.md's soak, coming_from_trl.md's conformance counts and field tables,
                    configuration.md's config reference

blocks.py collects them; `python scripts/update_readme.py` writes them all; tests/cli/test_readme.py checks
each against its raw rows.
"""
