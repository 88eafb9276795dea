"""Training and evaluation (the layers are described in docs/DESIGN.md).

* ``run`` -- the entry points: ``build_training(cfg, hooks)``, ``train(cfg, hooks)``, ``evaluate(cfg)``;
* ``plan`` -- the run plan (device, threads, layout, AMP, graph) decided from the frozen config;
* ``tasks`` -- the task plug-ins (``classification``, ``detection``): data, model, objective,
  evaluator, export spec;
* ``trainer`` -- ``Trainer(step, hooks)``, the loop; ``hooks`` -- what runs around it;
* ``step`` -- the step contract; ``dynamic_step`` and ``static`` -- the step strategies;
* building blocks: ``amp``, ``ema``, ``checkpoint`` (on disk: ``checkpoint_unit``, ``checkpoint_files``),
  ``run_dir`` (the output directory: lock, resume or start over), ``dist``, ``evaluator``, ``coco_eval``,
  ``objectives``, ``distill``, ``builders``, ``logger``, ``cpu_kernels``, ``detect_image``.
"""
