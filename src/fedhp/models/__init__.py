"""Model zoo in batched multi-client form."""

from fedhp.models import (
    linear,  # noqa: F401  (registers linreg, logreg, softmax)
    lstm,  # noqa: F401  (registers lstm)
)
from fedhp.models.base import BatchedModel
from fedhp.models.layout import ParamLayout
from fedhp.models.vmap import VmapModel
from fedhp.models.zoo import MODELS, ModelOptions

__all__ = ["MODELS", "BatchedModel", "ModelOptions", "ParamLayout", "VmapModel"]
