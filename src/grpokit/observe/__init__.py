"""What a run shows: metrics, trackers, completions, plots, the HTML report, the experiments' figures.

    metrics           phase timers, per-step statistics, metrics.jsonl
    loggers           TensorBoard, Weights & Biases, MLflow, Trackio behind one interface
    tracking          the completions log and the per-prompt history
    agent_metrics     multi-turn figures (turns, tool calls, errors, env tokens, limits) from trajectories
    plots, report     `grpokit plot` figures and `grpokit report` page
    accuracy_time     held-out accuracy against training seconds: time to a target accuracy
    demo, model_card  the demo's before/after table; the model card beside the final model
    experiments, experiment_plots, sweep_results   sweeps' tables, curves and figures
"""
