"""Training, evaluation and checkpointing: ``ppdlx.engine.run.train`` / ``evaluate`` drive the loops."""
