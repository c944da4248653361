"""One typed config: every choice declared once, validated when built, saved with every checkpoint.

    schema      GRPOConfig and its sections, defaults, YAML and dotted overrides, presets
    sections    the sections' dataclasses (model, task, rollout, reward, loss, optim), each field's help
    run_sections the run and rm sections (driving, logging, saving, launching a run; reward models)
    field_help  the field helpers the sections declare with (a field and its help text, a choice field)
    choices     every choice as a `Literal` type (help text, validation and switches derive from it)
    validation  range and consistency checks, one function per concern
    code_checks the code tasks' and the sandbox's settings (and the code rewards' names)
    reuse_checks rollout.steps_per_generation and optim.padding_free: ranges, modes they do not run with
    overlap_checks the modes reward.overlap (rewards beside the reference pass) does not run with
    run_config  the config of a command-line run (a YAML file or the built-in demo, plus overrides)
    sweep_spec  the sweep file of `grpokit sweep`
"""
