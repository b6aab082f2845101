"""Every op's variant declaration, in one list: what the build lowers and the manifest holds."""

from tilebake.quant.cast_back import CastBackVariant
from tilebake.quant.norm_backward import NormBackwardVariant
from tilebake.quant.norm_forward import NormForwardCastVariant, NormForwardVariant
from tilebake.quant.per_token_cast import PerTokenCastVariant

VARIANT_TYPES = (PerTokenCastVariant, CastBackVariant, NormForwardVariant, NormForwardCastVariant, NormBackwardVariant)


def all_variants():
    return [v for cls in VARIANT_TYPES for v in cls.all()]
