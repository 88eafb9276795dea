"""Checkpoints: ppdlx's checkpoint format, a training's checkpoints, and ``model.weights``.

On disk (:mod:`.unit`) each save is one directory ``<output_dir>/epoch_N/`` holding ``model.pdparams``,
``optimizer.pdopt``, ``states.pdstates`` and ``manifest.json`` (written last: sizes, sha256, epoch, model
identity); it appears whole by one rename, and ``latest`` / ``best`` are symlinks moved by one rename.

* :mod:`.unit` -- the directory format: written durably, verified against its manifest;
* :mod:`.files` -- naming and reading a checkpoint of either layout (a unit, or the earlier
  ``<prefix>.pdparams`` / ``.pdopt`` / ``.pdstates`` files), ``atomic_save``, and setting a state into a model
  cast to its dtypes (``set_state_cast``, ``check_and_set``);
* :mod:`.training` -- a training's checkpoints: ``save_epoch``, ``resolve_resume`` (``train.resume``),
  ``load_checkpoint``, ``check_resumable``, the random states a checkpoint carries;
* :mod:`.run_dir` -- the training's output directory: locked, resumed or started over;
* :mod:`.model_weights` -- ``load_weights``, the one loader of ``model.weights`` (a ppdlx checkpoint or a
  foreign one imported through ``ppdlx.weights``);
* :mod:`.convert` -- ``convert_weights``: a foreign checkpoint written once as ppdlx files.
"""
from ppdlx.checkpoint.convert import convert_weights  # noqa: F401
from ppdlx.checkpoint.files import (SUFFIXES, WEIGHTS_COPIES, atomic_save, check_and_set, is_ppdlx_prefix,  # noqa: F401
                                    load_prefix_weights, load_states, locate, not_found, read_checkpoint,
                                    read_pdparams, serialize, set_state_cast, strip_suffix)
from ppdlx.checkpoint.model_weights import RESET_HEAD, classifier_keys, load_weights  # noqa: F401
from ppdlx.checkpoint.run_dir import (check_ranks_resume_alike, prepare_output_dir,  # noqa: F401
                                      release_output_dir)
from ppdlx.checkpoint.training import (BEST, EPOCH_NAME, LATEST, capture_rng, check_resumable,  # noqa: F401
                                       checkpoint_names, load_checkpoint, model_mismatch, newest_complete,
                                       recorded_epoch, recorded_global_batch, resolve_resume, restore_rng,
                                       save_checkpoint, save_epoch, verify)
from ppdlx.checkpoint.unit import CheckpointError  # noqa: F401
