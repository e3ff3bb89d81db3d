"""The mcore-bridge 1.6.5 classes each model type PLT and the critics build through was verified against: its
loader and bridge (mcore-bridge registers the hybrids' other, transformers-module path under ``USE_MCORE_GDN=0``)."""
MCORE_BRIDGE_VERIFIED = 'mcore-bridge 1.6.5'


def verified_upstream(mcore_type: str):
    """``(loader class, bridge class)`` of mcore-bridge model type ``mcore_type`` as verified; KeyError for a type
    swift-plt does not build."""
    from mcore_bridge.bridge import GPTBridge
    from mcore_bridge.model.register import ModelLoader
    if mcore_type == 'gpt':
        return ModelLoader, GPTBridge
    if mcore_type == 'olmoe':  # its own attention (QK-norm over all heads' channels) on the `gpt` layer spec
        from mcore_bridge.model.gpts.olmoe import OLMoEBridge, OLMoELoader
        return OLMoELoader, OLMoEBridge
    if mcore_type == 'glm4':  # its own layer spec (Glm4SelfAttention / Glm4MLP: RMSNorms after attention and MLP)
        from mcore_bridge.model.gpts.glm4 import Glm4Bridge, Glm4Loader
        return Glm4Loader, Glm4Bridge
    if mcore_type == 'minimax_m2':  # its own attention (QK-norm over all heads' channels) and MoE bridge
        from mcore_bridge.model.gpts.minimax_m2 import MinimaxM2Bridge, MinimaxM2Loader
        return MinimaxM2Loader, MinimaxM2Bridge
    if mcore_type == 'hy_v3':  # the `gpt` loader; its bridge names the router, expert bias and shared MLP its way
        from mcore_bridge.model.gpts.hunyuan import HyV3Bridge
        return ModelLoader, HyV3Bridge
    if mcore_type == 'bailing_moe':  # the `gpt` loader; its bridge splits the fused QKV [Q heads | K | V] per group
        from mcore_bridge.model.gpts.bailing_moe import BailingMoeBridge
        return ModelLoader, BailingMoeBridge
    # the hybrids: mcore-bridge's default (USE_MCORE_GDN=1) path, megatron-core's Gated DeltaNet
    from mcore_bridge.model.gpts.qwen3_next_gdn import Qwen3NextGDNBridge, Qwen3NextLoader
    if mcore_type == 'qwen3_next':
        return Qwen3NextLoader, Qwen3NextGDNBridge
    if mcore_type == 'qwen3_5':
        from mcore_bridge.model.mm_gpts.qwen3_5_gdn import Qwen3_5Bridge
        return Qwen3NextLoader, Qwen3_5Bridge
    raise KeyError(mcore_type)


def upstream_moved(mcore_type: str, upstream) -> list:
    """What of mcore-bridge's meta ``upstream`` of ``mcore_type`` differs from the verified classes: a list of
    'its loader is X, not Y' lines (empty: as verified)."""
    loader, bridge = verified_upstream(mcore_type)
    return [f'its {what} is {cls.__module__}.{cls.__name__}, not the {ref.__module__}.{ref.__name__}'
            for what, cls, ref in (('loader', upstream.loader, loader), ('bridge', upstream.bridge_cls, bridge))
            if cls is not ref]
