"""User-facing errors: tools print ``str(err)`` as one line and exit non-zero."""


class PpdlxError(Exception):
    """An error caused by the user's input (config, data, files), not by a bug."""

    exit_code = 2


class ConfigError(PpdlxError):
    pass


class DataError(PpdlxError):
    pass


class UnsupportedError(PpdlxError):
    """A feature that this build / machine cannot run (e.g. fp16 on a CPU build)."""

    exit_code = 3
