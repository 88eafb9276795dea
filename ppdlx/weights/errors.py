"""The one error type of weight import: a one-line message naming the file and the tensor."""
from ppdlx.errors import DataError


class WeightsError(DataError):
    """A checkpoint that cannot be read safely or does not fit the model."""
