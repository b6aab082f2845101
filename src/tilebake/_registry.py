"""Every op's variant declaration, in one list: what the build lowers and the manifest holds."""

from tilebake.moe.expand_to_fused import ExpandToFusedVariant
from tilebake.moe.get_fused_mapping import GetFusedMappingVariant
from tilebake.moe.moe_topk_gate_backward import MoeTopkGateBackwardVariant
from tilebake.moe.moe_topk_gate_forward import MoeTopkGateForwardVariant
from tilebake.moe.normalize_weight import NormalizeWeightVariant
from tilebake.moe.reduce_fused import ReduceFusedVariant
from tilebake.moe.topk_gate import TopkGateVariant
from tilebake.quant.batched_transpose_weight_sf import BatchedTransposeWeightSfVariant
from tilebake.quant.cast import CastVariant
from tilebake.quant.cast_back import CastBackVariant
from tilebake.quant.norm_backward import NormBackwardVariant
from tilebake.quant.norm_forward import NormForwardCastVariant, NormForwardVariant
from tilebake.quant.per_block_cast import PerBlockCastVariant
from tilebake.quant.per_block_cast_lossless import PerBlockCastLosslessVariant
from tilebake.quant.per_channel_cast import PerChannelCastVariant
from tilebake.quant.per_token_cast import PerTokenCastVariant
from tilebake.quant.per_token_cast_and_cast_back import PerTokenCastAndCastBackVariant
from tilebake.quant.swiglu_backward import SwigluBackwardVariant
from tilebake.quant.swiglu_forward import SwigluForwardVariant
from tilebake.transform.apply_rotary import ApplyRotaryVariant

VARIANT_TYPES = (
    PerTokenCastVariant,
    CastBackVariant,
    PerTokenCastAndCastBackVariant,
    CastVariant,
    PerBlockCastVariant,
    PerChannelCastVariant,
    PerBlockCastLosslessVariant,
    BatchedTransposeWeightSfVariant,
    NormForwardVariant,
    NormForwardCastVariant,
    NormBackwardVariant,
    SwigluForwardVariant,
    SwigluBackwardVariant,
    ApplyRotaryVariant,
    TopkGateVariant,
    NormalizeWeightVariant,
    MoeTopkGateBackwardVariant,
    GetFusedMappingVariant,
    ExpandToFusedVariant,
    ReduceFusedVariant,
    MoeTopkGateForwardVariant,
)


def all_variants():
    return [v for cls in VARIANT_TYPES for v in cls.all()]
