"""The training loop: the single controller and what only it uses.

    trainer.py          `Trainer` (one step = rollout -> reward -> reference -> values ->
                        advantage -> critic -> update -> sync, each a named, timed call) and
                        `train`
    advantage_stage.py  the advantage stage: a StepBatch (+ KL, values) to advantages with the
                        configured estimator of `reasonrl.algo`, pure
    step_metrics.py     a step's `reward/`, `advantage/`, `rollout/`, `env/`, `mem/` metrics and
                        the zero-reward watch
    run_dir.py          the run directory: open, resume, log truncation, checkpoints, signals
    bad_steps.py        which steps are bad, what the run says of them, when it stops

The batch a step trains on comes from `reasonrl.source`, below this package.
"""
