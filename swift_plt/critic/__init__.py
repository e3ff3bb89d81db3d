"""Value-head critic for Megatron-SWIFT: model type ``llama3_2_critic`` (any Llama-family checkpoint).

Interface (stable; see docs/critic.md "Model, initialisation, formats"):
  CRITIC_MODEL_TYPE = 'llama3_2_critic'   ms-swift and mcore-bridge model type (``--model_type llama3_2_critic
                                           --custom_register_path custom_model/llama.py``)
  swift_plt.critic.model    CriticModelConfig, CriticGPTModel, CriticModelLoader, CriticBridge, values(output)
                            (imports mcore-bridge, i.e. Transformer Engine; on CPU only under tests/harness)
  swift_plt.critic.keys     pure: which HF keys a critic checkpoint must / may have, shape checks (torch-free)
  swift_plt.critic.convert  pure converters TRL / OpenRLHF / verl -> HF LlamaForTokenClassification(num_labels=1);
                            CLI ``python -m swift_plt.critic.convert --from trl|openrlhf|verl SRC DST``

The built model is called like upstream GPTModel, ``model(input_ids=..., position_ids=..., attention_mask=...,
packed_seq_params=..., labels=None)``; on the last pipeline stage it returns the per-token values ``[B, S, 1]`` in the
parameter dtype (bf16 in bf16 training, fp32 in fp32), on other stages the hidden states as upstream (``labels`` is
ignored: the critic computes no LM loss). ``values(output) == output[:, :-1].squeeze(-1)`` -> ``[B, S-1]``.

Importing this package is cheap (no torch).
"""
CRITIC_MODEL_TYPE = 'llama3_2_critic'
