"""Model families. Importing this package registers every model in ``MODELS``."""
from ppdlx.models import resnet  # noqa: F401
import ppdlx.models.gpunet  # noqa: F401
import ppdlx.models.efficientnet  # noqa: F401
import ppdlx.models.efficientdet  # noqa: F401
from ppdlx.registry import MODELS


def build_model(name: str, **kwargs):
    return MODELS.build(name, **kwargs)
