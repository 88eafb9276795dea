"""Training: the loop, the steps, the hooks and the assembly of a run (the layers are in docs/DESIGN.md).

* ``run`` -- the entry points: ``build_training(cfg, hooks)``, ``train(cfg, hooks)``, ``evaluate(cfg)``, and
  ``TrainingRun``, the builders of a run called in order;
* ``plan`` -- the run plan (device, threads, layout, CPU kernels, AMP, graph) decided from the frozen config;
  ``amp`` -- what AMP does on this machine, and the O2 casts;
* ``trainer`` -- ``Trainer(step, hooks)``, the loop; ``hooks`` -- what runs around it; ``logger`` -- progress lines;
* ``step`` -- the step contract; ``dynamic_step`` and ``static`` -- the step strategies; ``ema`` -- the EMA.

What a run is built from lives below: the task plug-ins (``ppdlx.tasks``), checkpoints (``ppdlx.checkpoint``),
evaluators (``ppdlx.evaluation``), the layers' CPU kernels (``ppdlx.layers``).
"""
