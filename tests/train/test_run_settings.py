"""run.data_seed, run.log_level, run.ddp_backend and run.ddp_* take effect where they belong."""

import logging

import torch

from easy_task import PROMPTS, easy_config
from grpokit.train.distributed import Distributed
from grpokit.train.loop import build_state, train_grpo


def _order(tmp_path, **over) -> list[str]:
    state = build_state(easy_config(tmp_path, **over), train_examples=PROMPTS)
    return [e.prompt for e in state.stream.take(2 * len(PROMPTS))]


def test_data_seed_orders_the_prompts_and_leaves_run_seed_the_rest(tmp_path):
    by_data_seed = _order(tmp_path / "a", **{"run.seed": 0, "run.data_seed": 5})
    assert by_data_seed == _order(tmp_path / "b", **{"run.seed": 5})
    assert by_data_seed != _order(tmp_path / "c", **{"run.seed": 0})
    # the model's init and the sampling still follow run.seed
    a = build_state(easy_config(tmp_path / "d", **{"run.seed": 0, "run.data_seed": 5}),
                    train_examples=PROMPTS)
    b = build_state(easy_config(tmp_path / "e", **{"run.seed": 0}), train_examples=PROMPTS)
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))


def test_log_level_sets_the_grpokit_logger_for_the_run_and_passive_leaves_it(tmp_path):
    logger = logging.getLogger("grpokit")
    kept = logger.level
    try:
        logger.setLevel(logging.DEBUG)
        seen = []
        hooks = {"after_step": lambda state, metrics: seen.append(logger.level)}
        train_grpo(easy_config(tmp_path / "a", **{"run.max_steps": 1, "run.log_level": "error"}),
                   train_examples=PROMPTS, hooks=hooks)
        assert seen == [logging.ERROR] and logger.level == logging.DEBUG     # the caller's level again
        train_grpo(easy_config(tmp_path / "b", **{"run.max_steps": 1}), train_examples=PROMPTS, hooks=hooks)
        assert seen[-1] == logging.DEBUG == logger.level
    finally:
        logger.setLevel(kept)


def test_ddp_backend_and_options_reach_the_process_group_and_the_wrapper(tmp_path, monkeypatch):
    import torch.distributed as tdist
    import torch.nn.parallel

    opened, wrapped = {}, {}
    monkeypatch.setattr(tdist, "is_initialized", lambda: False)
    monkeypatch.setattr(tdist, "init_process_group", lambda backend, **kw: opened.update(backend=backend))
    monkeypatch.setattr(tdist, "get_rank", lambda: 0)
    monkeypatch.setattr(tdist, "get_world_size", lambda: 2)
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel",
                        lambda module, device_ids=None, **kw: wrapped.update(kw) or module)
    run = easy_config(tmp_path, **{"run.ddp_backend": "mpi", "run.ddp_find_unused_parameters": True,
                                   "run.ddp_bucket_cap_mb": 50, "run.ddp_broadcast_buffers": False,
                                   "run.ddp_static_graph": True}).run
    d = Distributed.for_run(run, device="cpu")
    assert opened == {"backend": "mpi"} and d.backend == "mpi"
    d.prepare(torch.nn.Linear(2, 2))
    assert wrapped == {"find_unused_parameters": True, "bucket_cap_mb": 50, "broadcast_buffers": False,
                       "static_graph": True}
    auto = Distributed.for_run(easy_config(tmp_path, **{}).run, device="cpu")
    assert opened == {"backend": "gloo"} and auto.ddp_options["bucket_cap_mb"] == 25


def test_torch_empty_cache_steps_empties_the_device_cache_every_n_steps(tmp_path, monkeypatch):
    from grpokit.model.devices import empty_cache
    from grpokit.train import loop

    assert empty_cache(torch.device("cpu")) is False          # the CPU keeps no cache
    steps = []
    hooks = {"after_step": lambda state, metrics: steps.append(state.step)}
    emptied = []
    monkeypatch.setattr(loop, "empty_cache", lambda device: emptied.append((len(steps) + 1, device.type)))
    train_grpo(easy_config(tmp_path / "a", **{"run.max_steps": 5, "run.torch_empty_cache_steps": 2}),
               train_examples=PROMPTS, hooks=hooks)
    assert emptied == [(2, "cpu"), (4, "cpu")]
    emptied.clear()
    train_grpo(easy_config(tmp_path / "b", **{"run.max_steps": 2}), train_examples=PROMPTS, hooks=hooks)
    assert emptied == []


def test_input_tokens_seen_counts_prompt_and_completion_tokens_across_a_resume(tmp_path, one_thread):
    import json

    rows = []
    cfg = easy_config(tmp_path / "whole", **{"run.max_steps": 4})
    train_grpo(cfg, train_examples=PROMPTS, hooks={"after_step": lambda s, m: rows.append(m)})
    counts = [r["input_tokens_seen"] for r in rows]
    assert counts[0] > 0 and all(b > a for a, b in zip(counts, counts[1:]))
    half = easy_config(tmp_path / "half", **{"run.max_steps": 2, "run.save_steps": 2})
    train_grpo(half, train_examples=PROMPTS)
    resumed = easy_config(tmp_path / "half", **{"run.max_steps": 4, "run.save_steps": 2, "run.resume": True})
    train_grpo(resumed, train_examples=PROMPTS)
    lines = (tmp_path / "half" / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["input_tokens_seen"] for line in lines] == counts
