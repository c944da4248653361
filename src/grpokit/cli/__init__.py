"""The `grpokit` command (main.py) and one module per subcommand, each with `main(argv) -> int`.

    train  eval  sft  plot  report  bench (membench: --memory; recipebench: --memory --config)  sweep  rm
    vllm_serve  sandbox_serve
"""
