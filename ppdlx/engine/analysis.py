"""The per-class analysis of an evaluation: the task plug-in names its ``ppdlx.analysis`` function
(``Task.analysis``) and gives its arguments from what its evaluator kept (``Task.analysis_inputs``). Called from
here, not from the plug-ins, because ``ppdlx.analysis`` itself asks ``ppdlx.engine.tasks`` which task a config is."""
from __future__ import annotations


def write_analysis(task, cfg, evaluator, out_dir: str):
    """Rank 0: ``analysis.md`` and figures in ``out_dir`` for ``evaluator``'s last evaluation; the analysis
    dict, or None when the evaluation kept nothing to analyse."""
    import ppdlx.analysis
    inputs = task.analysis_inputs(cfg, evaluator)
    if inputs is None:
        return None
    return getattr(ppdlx.analysis, task.analysis)(out_dir=out_dir, **inputs)
