"""Value-head critic for Megatron-SWIFT: one model type per decoder family (swift_plt.critic.families), e.g.
``llama3_2_critic`` (Llama checkpoints), ``qwen3_critic``, ``qwen3_moe_critic``.

Interface (stable; see docs/critic.md "Model, initialisation, formats"):
  CRITIC_MODEL_TYPE = 'llama3_2_critic'   the first critic model type (``--model_type llama3_2_critic``; every
                                           critic type is registered when the plugin activates)
  swift_plt.critic.families CRITIC_FAMILIES: critic model type -> family (HF model_type, template, arch)
  swift_plt.critic.model    CriticModelConfig, CriticGPTModel, CriticModelLoader, CriticBridge, values(output)
                            (imports mcore-bridge, i.e. Transformer Engine; on CPU only under tests/harness)
  swift_plt.critic.keys     which HF keys a critic checkpoint must / may have (the family's own HF trunk), shape checks
  swift_plt.critic.convert  pure converters TRL / OpenRLHF / verl -> HF <Family>ForTokenClassification(num_labels=1);
                            CLI ``python -m swift_plt.critic.convert --from trl|openrlhf|verl SRC DST``

The built model is called like upstream GPTModel, ``model(input_ids=..., position_ids=..., attention_mask=...,
packed_seq_params=..., labels=None)``; on the last pipeline stage it returns the per-token values ``[B, S, 1]`` in the
parameter dtype (bf16 in bf16 training, fp32 in fp32), on other stages the hidden states as upstream (``labels`` is
ignored: the critic computes no LM loss). ``values(output) == output[:, :-1].squeeze(-1)`` -> ``[B, S-1]``.

Importing this package is cheap (no torch).
"""
from swift_plt.families.dense import LLAMA_CRITIC as CRITIC_MODEL_TYPE  # noqa: F401  (the record names it)
