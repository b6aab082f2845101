"""Every op's variant declaration, in one list: what the build lowers and the manifest holds."""

from tilebake.quant.cast_back import CastBackVariant
from tilebake.quant.per_token_cast import PerTokenCastVariant

VARIANT_TYPES = (PerTokenCastVariant, CastBackVariant)


def all_variants():
    return [v for cls in VARIANT_TYPES for v in cls.all()]


from tilebake.quant.per_token_cast_and_cast_back import PerTokenCastAndCastBackVariant  # noqa: E402

VARIANT_TYPES += (PerTokenCastAndCastBackVariant,)

from tilebake.quant.cast import CastVariant  # noqa: E402

VARIANT_TYPES += (CastVariant,)
