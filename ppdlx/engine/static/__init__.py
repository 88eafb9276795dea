"""Static-graph training (``train.graph=static``), split by concern:

* :mod:`.ir_compat` -- PIR / legacy IR differences, the static-mode switch, the oneDNN guard;
* :mod:`.feed` -- loader batches handed to the executor without a host round trip;
* :mod:`.program` -- tracing the train and eval programs from the dynamic ``Layer``;
* :mod:`.state` -- checkpoint state <-> scope variables (masters, accumulators, loss scaling, EMA);
* :mod:`.amp` -- what static AMP does here (plan, probe step) and its program pieces;
* :mod:`.step` -- :class:`~ppdlx.engine.static.step.StaticProgramStep`, the step strategy the
  trainer runs.

Nothing here reads the config: :mod:`ppdlx.tasks.classification` turns it into a
:class:`~ppdlx.engine.static.program.ProgramSpec` of plain arguments and builders.
"""
