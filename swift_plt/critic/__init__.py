"""Value-head critic model type for Megatron-SWIFT (issue 4)."""
CRITIC_MODEL_TYPE = 'llama3_2_critic'
