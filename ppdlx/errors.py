"""User-facing errors: tools print ``str(err)`` as one line and exit non-zero."""
import reprlib

# How much of a value an error line quotes: a YAML alias bomb expands to a value whose full repr is hundreds
# of megabytes (reprlib walks only the part it shows).
QUOTE_CHARS = 120
_QUOTER = reprlib.Repr()
_QUOTER.maxlevel = 3
_QUOTER.maxtuple = _QUOTER.maxlist = _QUOTER.maxdict = _QUOTER.maxset = _QUOTER.maxfrozenset = 6
_QUOTER.maxstring = _QUOTER.maxother = QUOTE_CHARS


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


def quote(value) -> str:
    """``repr(value)`` for an error line, cut to about ``QUOTE_CHARS`` characters however large the value."""
    text = _QUOTER.repr(value)
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS - 3] + "..."


def paddle_error_line(err: BaseException) -> str:
    """The message line of a Paddle error (C++ stack and enforce markers dropped)."""
    lines = [l.strip() for l in str(err).splitlines() if l.strip() and not l.strip().startswith("[")]
    line = (lines[-1] if lines else type(err).__name__).split(" (at /paddle")[0]
    if line == "std::exception":
        line = "a oneDNN kernel raised dnnl::error"
    return line.replace("(InvalidType) ", "").rstrip(", ")[:200]
