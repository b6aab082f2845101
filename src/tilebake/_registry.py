"""Every op's variant declaration, in one list: what the build lowers and the manifest holds."""

from tilebake.quant.cast_back import CastBackVariant
from tilebake.quant.per_token_cast import PerTokenCastVariant
from tilebake.quant.swiglu_backward import SwigluBackwardVariant
from tilebake.quant.swiglu_forward import SwigluForwardVariant

VARIANT_TYPES = (PerTokenCastVariant, CastBackVariant)
VARIANT_TYPES += (SwigluForwardVariant, SwigluBackwardVariant)


def all_variants():
    return [v for cls in VARIANT_TYPES for v in cls.all()]
