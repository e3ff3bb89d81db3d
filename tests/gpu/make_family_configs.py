#!/usr/bin/env python3
"""Random-init HF model dirs with the published config.json of the families transformers builds without remote code
and of Ling 2.0 (layers / experts cut to fit one 80 GB GPU), for parity.py and the family throughput benchmark.
Nothing is downloaded; the tokenizer is the tiny BPE one.

    python3 tests/gpu/make_family_configs.py --out DIR [--only NAME,...|default|more|hybrid|new|all] [--device cuda]
                                             [--estimate] [--tiny] [--list]

Writes DIR/NAME/{config.json, *.safetensors (bf16, the configs' torch_dtype), tokenizer files} for each NAME and
prints parameters and bytes per model. Groups: `default` (DEFAULT: qwen2.5-1.5b, qwen3-1.7b, qwen3-30b-a3b-cut,
deepseek-v3-cut), `more` (MORE: the other `gpt` families), `hybrid` (HYBRID: the Gated-DeltaNet hybrids Qwen3-Next and
Qwen3.5 dense / MoE), `new` (NEW: GPT-OSS, OLMoE, GLM-4-0414, MiniMax-M2, Hunyuan-V3, Ling 2.0, Qwen3-VL:
mcore-bridge's own decoder types and GPT-OSS), `all`. config.json is the published one with only the cut fields
changed (so mcore-bridge and transformers read what a hub download gives them); each entry says which model it is and
where its values come from. Qwen3.5 and Qwen3-VL checkpoints are multimodal (text_config + vision_config, written as
the class named in `architectures`, Qwen3_5[Moe]ForConditionalGeneration / Qwen3VLForConditionalGeneration; PLT
trains their language model on text: the records' text_only_multimodal): their cut applies to text_config, and the
vision tower is cut to small blocks (Qwen3.5 one, Qwen3-VL three, one per deepstack merger). Kimi-K2 (config.json
model_type kimi_k2, remote code) is written as its DeepSeek-V3 architecture (model_type deepseek_v3). Ling 2.0
(bailing_moe: remote code only) is built from tests/harness/bailing_moe.py, its published modeling code written out
(HAND_WRITTEN). Weights: HF's init (normal(0, initializer_range)), then biases, RMSNorm weights, the routers' expert
bias and GPT-OSS's sinks made random too (1 + N(0, 0.1) for norms), so a mis-mapped bias or norm changes the logits;
ERNIE-4.5-MoE's stays 0 (NO_ROUTER_BIAS). --tiny: the same structures at toy widths (CPU tests). --estimate: print
the sizes only (meta device, no weights).
"""
import argparse
import copy
import json
import os
import shutil
import sys
import tempfile
import time

# Published config.json of each model (the fields transformers and mcore-bridge read; quantization_config dropped).
QWEN25_15B = {
    'architectures': ['Qwen2ForCausalLM'], 'attention_dropout': 0.0, 'bos_token_id': 151643, 'eos_token_id': 151643,
    'hidden_act': 'silu', 'hidden_size': 1536, 'initializer_range': 0.02, 'intermediate_size': 8960,
    'max_position_embeddings': 131072, 'max_window_layers': 28, 'model_type': 'qwen2', 'num_attention_heads': 12,
    'num_hidden_layers': 28, 'num_key_value_heads': 2, 'rms_norm_eps': 1e-06, 'rope_theta': 1000000.0,
    'sliding_window': 131072, 'tie_word_embeddings': True, 'torch_dtype': 'bfloat16', 'use_cache': True,
    'use_sliding_window': False, 'vocab_size': 151936,
}  # yapf: disable
QWEN3_17B = {
    'architectures': ['Qwen3ForCausalLM'], 'attention_bias': False, 'attention_dropout': 0.0, 'bos_token_id': 151643,
    'eos_token_id': 151645, 'head_dim': 128, 'hidden_act': 'silu', 'hidden_size': 2048, 'initializer_range': 0.02,
    'intermediate_size': 6144, 'max_position_embeddings': 40960, 'max_window_layers': 28, 'model_type': 'qwen3',
    'num_attention_heads': 16, 'num_hidden_layers': 28, 'num_key_value_heads': 8, 'rms_norm_eps': 1e-06,
    'rope_scaling': None, 'rope_theta': 1000000, 'sliding_window': None, 'tie_word_embeddings': True,
    'torch_dtype': 'bfloat16', 'use_cache': True, 'use_sliding_window': False, 'vocab_size': 151936,
}  # yapf: disable
QWEN3_30B_A3B = {
    'architectures': ['Qwen3MoeForCausalLM'], 'attention_bias': False, 'attention_dropout': 0.0,
    'bos_token_id': 151643, 'decoder_sparse_step': 1, 'eos_token_id': 151645, 'head_dim': 128, 'hidden_act': 'silu',
    'hidden_size': 2048, 'initializer_range': 0.02, 'intermediate_size': 6144, 'max_position_embeddings': 40960,
    'max_window_layers': 48, 'mlp_only_layers': [], 'model_type': 'qwen3_moe', 'moe_intermediate_size': 768,
    'norm_topk_prob': True, 'num_attention_heads': 32, 'num_experts': 128, 'num_experts_per_tok': 8,
    'num_hidden_layers': 48, 'num_key_value_heads': 4, 'output_router_logits': False, 'rms_norm_eps': 1e-06,
    'rope_scaling': None, 'rope_theta': 1000000.0, 'router_aux_loss_coef': 0.001, 'sliding_window': None,
    'tie_word_embeddings': False, 'torch_dtype': 'bfloat16', 'use_cache': True, 'use_sliding_window': False,
    'vocab_size': 151936,
}  # yapf: disable
DEEPSEEK_V3 = {
    'architectures': ['DeepseekV3ForCausalLM'], 'attention_bias': False, 'attention_dropout': 0.0, 'bos_token_id': 0,
    'eos_token_id': 1, 'ep_size': 1, 'first_k_dense_replace': 3, 'hidden_act': 'silu', 'hidden_size': 7168,
    'initializer_range': 0.02, 'intermediate_size': 18432, 'kv_lora_rank': 512, 'max_position_embeddings': 163840,
    'model_type': 'deepseek_v3', 'moe_intermediate_size': 2048, 'moe_layer_freq': 1, 'n_group': 8,
    'n_routed_experts': 256, 'n_shared_experts': 1, 'norm_topk_prob': True, 'num_attention_heads': 128,
    'num_experts_per_tok': 8, 'num_hidden_layers': 61, 'num_key_value_heads': 128, 'num_nextn_predict_layers': 1,
    'q_lora_rank': 1536, 'qk_nope_head_dim': 128, 'qk_rope_head_dim': 64,
    'rope_scaling': {'beta_fast': 32, 'beta_slow': 1, 'factor': 40, 'mscale': 1.0, 'mscale_all_dim': 1.0,
                     'original_max_position_embeddings': 4096, 'type': 'yarn'},
    'rms_norm_eps': 1e-06, 'rope_theta': 10000, 'routed_scaling_factor': 2.5, 'scoring_func': 'sigmoid',
    'tie_word_embeddings': False, 'topk_group': 4, 'topk_method': 'noaux_tc', 'torch_dtype': 'bfloat16',
    'use_cache': True, 'v_head_dim': 128, 'vocab_size': 129280,
}  # yapf: disable

# Qwen/Qwen1.5-MoE-A2.7B (qwen2_moe: shared expert with a sigmoid gate, softmax top-4 not renormalised). Values:
# public copies of its config.json (the Chat GPTQ repo's config, the base model's max_position_embeddings).
QWEN15_MOE_A27B = {
    'architectures': ['Qwen2MoeForCausalLM'], 'attention_dropout': 0.0, 'bos_token_id': 151643,
    'decoder_sparse_step': 1, 'eos_token_id': 151643, 'hidden_act': 'silu', 'hidden_size': 2048,
    'initializer_range': 0.02, 'intermediate_size': 5632, 'max_position_embeddings': 8192, 'max_window_layers': 21,
    'model_type': 'qwen2_moe', 'moe_intermediate_size': 1408, 'norm_topk_prob': False, 'num_attention_heads': 16,
    'num_experts': 60, 'num_experts_per_tok': 4, 'num_hidden_layers': 24, 'num_key_value_heads': 16,
    'output_router_logits': False, 'rms_norm_eps': 1e-06, 'rope_theta': 1000000.0, 'router_aux_loss_coef': 0.001,
    'shared_expert_intermediate_size': 5632, 'sliding_window': 32768, 'tie_word_embeddings': False,
    'torch_dtype': 'bfloat16', 'use_cache': True, 'use_sliding_window': False, 'vocab_size': 151936,
}  # yapf: disable
# zai-org/GLM-4.5-Air (glm4_moe: partial rotary 0.5, qkv bias, sigmoid routing with expert bias, a shared expert,
# first_k_dense_replace=1, an MTP layer). Values: its config.json as ms-swift's model dump prints it.
GLM45_AIR = {
    'architectures': ['Glm4MoeForCausalLM'], 'attention_bias': True, 'attention_dropout': 0.0,
    'eos_token_id': [151329, 151336, 151338], 'first_k_dense_replace': 1, 'head_dim': 128, 'hidden_act': 'silu',
    'hidden_size': 4096, 'initializer_range': 0.02, 'intermediate_size': 10944, 'max_position_embeddings': 131072,
    'model_type': 'glm4_moe', 'moe_intermediate_size': 1408, 'n_group': 1, 'n_routed_experts': 128,
    'n_shared_experts': 1, 'norm_topk_prob': True, 'num_attention_heads': 96, 'num_experts_per_tok': 8,
    'num_hidden_layers': 46, 'num_key_value_heads': 8, 'num_nextn_predict_layers': 1, 'pad_token_id': 151329,
    'partial_rotary_factor': 0.5, 'rms_norm_eps': 1e-05, 'rope_scaling': None, 'rope_theta': 1000000,
    'routed_scaling_factor': 1.0, 'tie_word_embeddings': False, 'topk_group': 1, 'torch_dtype': 'bfloat16',
    'use_cache': True, 'use_qk_norm': False, 'vocab_size': 151552,
}  # yapf: disable
# zai-org/GLM-4.7-Flash (glm4_moe_lite: MLA with q-LoRA, v_head_dim 256 != qk_nope_head_dim 192, sigmoid routing with
# expert bias, a shared expert, first_k_dense_replace=1). Values: a public exact copy of its config.json (bf16).
GLM47_FLASH = {
    'architectures': ['Glm4MoeLiteForCausalLM'], 'attention_bias': False, 'attention_dropout': 0.0,
    'pad_token_id': 154820, 'eos_token_id': [154820, 154827, 154829], 'hidden_act': 'silu', 'hidden_size': 2048,
    'intermediate_size': 10240, 'max_position_embeddings': 202752, 'model_type': 'glm4_moe_lite',
    'moe_intermediate_size': 1536, 'topk_method': 'noaux_tc', 'norm_topk_prob': True, 'num_attention_heads': 20,
    'n_group': 1, 'topk_group': 1, 'n_routed_experts': 64, 'n_shared_experts': 1, 'routed_scaling_factor': 1.8,
    'num_experts_per_tok': 4, 'first_k_dense_replace': 1, 'num_hidden_layers': 47, 'num_key_value_heads': 20,
    'num_nextn_predict_layers': 1, 'partial_rotary_factor': 1.0, 'rms_norm_eps': 1e-05, 'rope_scaling': None,
    'rope_theta': 1000000, 'tie_word_embeddings': False, 'dtype': 'bfloat16', 'q_lora_rank': 768,
    'kv_lora_rank': 512, 'qk_nope_head_dim': 192, 'qk_rope_head_dim': 64, 'v_head_dim': 256, 'vocab_size': 154880,
}  # yapf: disable
# deepseek-ai/DeepSeek-V2-Lite (deepseek_v2: MLA without q-LoRA, YaRN with mscale = mscale_all_dim, softmax greedy
# top-6 not renormalised, 2 shared experts, first_k_dense_replace=1). Values: a public copy of its config.json
# (auto_map and bookkeeping keys dropped).
DEEPSEEK_V2_LITE = {
    'architectures': ['DeepseekV2ForCausalLM'], 'attention_bias': False, 'aux_loss_alpha': 0.001,
    'bos_token_id': 100000, 'eos_token_id': 100001, 'first_k_dense_replace': 1, 'hidden_act': 'silu',
    'hidden_size': 2048, 'initializer_range': 0.02, 'intermediate_size': 10944, 'kv_lora_rank': 512,
    'max_position_embeddings': 163840, 'model_type': 'deepseek_v2', 'moe_intermediate_size': 1408,
    'moe_layer_freq': 1, 'n_group': 1, 'n_routed_experts': 64, 'n_shared_experts': 2, 'norm_topk_prob': False,
    'num_attention_heads': 16, 'num_experts_per_tok': 6, 'num_hidden_layers': 27, 'num_key_value_heads': 16,
    'q_lora_rank': None, 'qk_nope_head_dim': 128, 'qk_rope_head_dim': 64, 'rms_norm_eps': 1e-06,
    'rope_scaling': {'beta_fast': 32, 'beta_slow': 1, 'factor': 40, 'mscale': 0.707, 'mscale_all_dim': 0.707,
                     'original_max_position_embeddings': 4096, 'type': 'yarn'},
    'rope_theta': 10000, 'routed_scaling_factor': 1.0, 'scoring_func': 'softmax', 'seq_aux': True,
    'tie_word_embeddings': False, 'topk_group': 1, 'topk_method': 'greedy', 'torch_dtype': 'bfloat16',
    'use_cache': True, 'v_head_dim': 128, 'vocab_size': 102400,
}  # yapf: disable
# baidu/ERNIE-4.5-0.3B-PT (ernie4_5: interleaved rotary, head_dim 128 != hidden / heads, tied embeddings). Values:
# public copies of its config.json and transformers' Ernie4_5Config (whose defaults are this checkpoint).
ERNIE45_03B = {
    'architectures': ['Ernie4_5ForCausalLM'], 'bos_token_id': 1, 'eos_token_id': 2, 'head_dim': 128,
    'hidden_act': 'silu', 'hidden_size': 1024, 'initializer_range': 0.02, 'intermediate_size': 3072,
    'max_position_embeddings': 131072, 'model_type': 'ernie4_5', 'num_attention_heads': 16, 'num_hidden_layers': 18,
    'num_key_value_heads': 2, 'pad_token_id': 0, 'rms_norm_eps': 1e-05, 'rope_theta': 500000.0,
    'tie_word_embeddings': True, 'torch_dtype': 'bfloat16', 'use_bias': False, 'use_cache': True,
    'vocab_size': 103424,
}  # yapf: disable
# baidu/ERNIE-4.5-21B-A3B-PT (ernie4_5_moe: interleaved rotary, softmax top-6 renormalised, 2 shared experts, MoE
# from moe_layer_start_index=1, tied embeddings). Values: public copies of its config.json and transformers'
# Ernie4_5_MoeConfig (whose defaults are this checkpoint).
ERNIE45_21B_A3B = {
    'architectures': ['Ernie4_5_MoeForCausalLM'], 'bos_token_id': 1, 'eos_token_id': 2, 'head_dim': 128,
    'hidden_act': 'silu', 'hidden_size': 2560, 'initializer_range': 0.02, 'intermediate_size': 12288,
    'max_position_embeddings': 131072, 'model_type': 'ernie4_5_moe', 'moe_intermediate_size': 1536, 'moe_k': 6,
    'moe_layer_end_index': 27, 'moe_layer_interval': 1, 'moe_layer_start_index': 1, 'moe_num_experts': 64,
    'moe_num_shared_experts': 2, 'num_attention_heads': 20, 'num_hidden_layers': 28, 'num_key_value_heads': 4,
    'pad_token_id': 0, 'rms_norm_eps': 1e-05, 'rope_theta': 500000.0, 'tie_word_embeddings': True,
    'torch_dtype': 'bfloat16', 'use_bias': False, 'use_cache': True, 'vocab_size': 103424,
}  # yapf: disable
# rednote-hilab/dots.llm1.base (dots1: QK-norm, sigmoid routing with expert bias, top-6 of 128, 2 shared experts,
# first_k_dense_replace=1). Values: public copies of its config.json (n_group / topk_group left to transformers'
# default 1, one group).
DOTS_LLM1 = {
    'architectures': ['Dots1ForCausalLM'], 'attention_bias': False, 'attention_dropout': 0.0,
    'first_k_dense_replace': 1, 'hidden_act': 'silu', 'hidden_size': 4096, 'initializer_range': 0.02,
    'intermediate_size': 10944, 'max_position_embeddings': 32768, 'model_type': 'dots1',
    'moe_intermediate_size': 1408, 'n_routed_experts': 128, 'n_shared_experts': 2, 'norm_topk_prob': True,
    'num_attention_heads': 32, 'num_experts_per_tok': 6, 'num_hidden_layers': 62, 'num_key_value_heads': 32,
    'rms_norm_eps': 1e-05, 'rope_scaling': None, 'rope_theta': 10000000, 'routed_scaling_factor': 2.5,
    'scoring_func': 'sigmoid', 'sliding_window': None, 'tie_word_embeddings': False, 'torch_dtype': 'bfloat16',
    'use_cache': True, 'vocab_size': 152064,
}  # yapf: disable
# moonshotai/Kimi-K2-Instruct as its DeepSeek-V3 architecture: its config.json (model_type kimi_k2, the model's own
# remote code) with model_type deepseek_v3, which transformers builds. Kimi-K2's shape: 64 heads, 384 experts in one
# group, routed_scaling_factor 2.827, YaRN factor 32. Values: public copies of its config.json.
KIMI_K2 = {
    'architectures': ['DeepseekV3ForCausalLM'], 'attention_bias': False, 'attention_dropout': 0.0,
    'aux_loss_alpha': 0.001, 'bos_token_id': 163584, 'eos_token_id': 163585, 'first_k_dense_replace': 1,
    'hidden_act': 'silu', 'hidden_size': 7168, 'initializer_range': 0.02, 'intermediate_size': 18432,
    'kv_lora_rank': 512, 'max_position_embeddings': 131072, 'model_type': 'deepseek_v3',
    'moe_intermediate_size': 2048, 'moe_layer_freq': 1, 'n_group': 1, 'n_routed_experts': 384,
    'n_shared_experts': 1, 'norm_topk_prob': True, 'num_attention_heads': 64, 'num_experts_per_tok': 8,
    'num_hidden_layers': 61, 'num_key_value_heads': 64, 'num_nextn_predict_layers': 0, 'q_lora_rank': 1536,
    'qk_nope_head_dim': 128, 'qk_rope_head_dim': 64, 'rms_norm_eps': 1e-06,
    'rope_scaling': {'beta_fast': 1.0, 'beta_slow': 1.0, 'factor': 32.0, 'mscale': 1.0, 'mscale_all_dim': 1.0,
                     'original_max_position_embeddings': 4096, 'type': 'yarn'},
    'rope_theta': 50000.0, 'routed_scaling_factor': 2.827, 'scoring_func': 'sigmoid', 'seq_aux': True,
    'tie_word_embeddings': False, 'topk_group': 1, 'topk_method': 'noaux_tc', 'torch_dtype': 'bfloat16',
    'use_cache': True, 'v_head_dim': 128, 'vocab_size': 163840,
}  # yapf: disable

# meta-llama/Llama-3.2-1B (llama: llama3 RoPE scaling, tied embeddings); also the 1B shape of the benchmarks
LLAMA32_1B = {
    'architectures': ['LlamaForCausalLM'], 'attention_bias': False, 'attention_dropout': 0.0,
    'bos_token_id': 128000, 'eos_token_id': 128001, 'head_dim': 64, 'hidden_act': 'silu', 'hidden_size': 2048,
    'initializer_range': 0.02, 'intermediate_size': 8192, 'max_position_embeddings': 131072, 'mlp_bias': False,
    'model_type': 'llama', 'num_attention_heads': 32, 'num_hidden_layers': 16, 'num_key_value_heads': 8,
    'pretraining_tp': 1, 'rms_norm_eps': 1e-05,
    'rope_scaling': {'factor': 32.0, 'high_freq_factor': 4.0, 'low_freq_factor': 1.0,
                     'original_max_position_embeddings': 8192, 'rope_type': 'llama3'},
    'rope_theta': 500000.0, 'tie_word_embeddings': True, 'torch_dtype': 'bfloat16', 'use_cache': True,
    'vocab_size': 128256,
}  # yapf: disable

# --- mcore-bridge's own decoder types and GPT-OSS (group `new`) ---
# openai/gpt-oss-20b (gpt_oss: sliding-window attention, 128 tokens, in every other layer; learned attention sinks;
# biases in attention, router and experts; clamped SwiGLU experts, softmax over the top-4 router logits; YaRN).
# Values: public copies of its config.json (and gpt-oss-120b's, which differs in layers and experts only).
GPT_OSS_20B = {
    'architectures': ['GptOssForCausalLM'], 'attention_bias': True, 'attention_dropout': 0.0, 'eos_token_id': 200002,
    'experts_per_token': 4, 'head_dim': 64, 'hidden_act': 'silu', 'hidden_size': 2880,
    'initial_context_length': 4096, 'initializer_range': 0.02, 'intermediate_size': 2880,
    'layer_types': ['sliding_attention', 'full_attention'] * 12, 'max_position_embeddings': 131072,
    'model_type': 'gpt_oss', 'num_attention_heads': 64, 'num_experts_per_tok': 4, 'num_hidden_layers': 24,
    'num_key_value_heads': 8, 'num_local_experts': 32, 'output_router_logits': False, 'pad_token_id': 199999,
    'rms_norm_eps': 1e-05,
    'rope_scaling': {'beta_fast': 32.0, 'beta_slow': 1.0, 'factor': 32.0, 'original_max_position_embeddings': 4096,
                     'rope_type': 'yarn', 'truncate': False},
    'rope_theta': 150000, 'router_aux_loss_coef': 0.9, 'sliding_window': 128, 'swiglu_limit': 7.0,
    'tie_word_embeddings': False, 'torch_dtype': 'bfloat16', 'use_cache': True, 'vocab_size': 201088,
}  # yapf: disable
# allenai/OLMoE-1B-7B-0924 (olmoe: QK-norm over all heads' channels, softmax top-8 of 64 not renormalised, no shared
# expert, MoE in every layer). Values: public copies of its config.json.
OLMOE_1B_7B = {
    'architectures': ['OlmoeForCausalLM'], 'attention_bias': False, 'attention_dropout': 0.0, 'clip_qkv': None,
    'eos_token_id': 50279, 'hidden_act': 'silu', 'hidden_size': 2048, 'initializer_range': 0.02,
    'intermediate_size': 1024, 'max_position_embeddings': 4096, 'model_type': 'olmoe', 'norm_topk_prob': False,
    'num_attention_heads': 16, 'num_experts': 64, 'num_experts_per_tok': 8, 'num_hidden_layers': 16,
    'num_key_value_heads': 16, 'output_router_logits': False, 'pad_token_id': 1, 'rms_norm_eps': 1e-05,
    'rope_scaling': None, 'rope_theta': 10000.0, 'router_aux_loss_coef': 0.01, 'tie_word_embeddings': False,
    'torch_dtype': 'bfloat16', 'use_cache': True, 'vocab_size': 50304,
}  # yapf: disable
# THUDM/GLM-4-9B-0414 (glm4: RMSNorms after attention and after the MLP, interleaved rotary over half of head_dim,
# qkv bias, 32 heads over 2 kv heads, fused gate_up_proj). Values: its config.json as public copies and transformers'
# Glm4Config give it (hidden / layers / heads / FFN / vocab; max_position_embeddings 32768, the 0414 context).
GLM4_9B_0414 = {
    'architectures': ['Glm4ForCausalLM'], 'attention_bias': True, 'attention_dropout': 0.0,
    'eos_token_id': [151329, 151336, 151338], 'head_dim': 128, 'hidden_act': 'silu', 'hidden_size': 4096,
    'initializer_range': 0.02, 'intermediate_size': 13696, 'max_position_embeddings': 32768, 'model_type': 'glm4',
    'num_attention_heads': 32, 'num_hidden_layers': 40, 'num_key_value_heads': 2, 'pad_token_id': 151329,
    'partial_rotary_factor': 0.5, 'rms_norm_eps': 1e-05, 'rope_theta': 10000.0, 'tie_word_embeddings': False,
    'torch_dtype': 'bfloat16', 'use_cache': True, 'vocab_size': 151552,
}  # yapf: disable
# MiniMaxAI/MiniMax-M2 (minimax_m2: QK-norm over all heads' channels, partial rotary (rotary_dim 64 of 128), 48
# heads over 8 kv heads, sigmoid routing with an expert bias, top-8 of 256 renormalised, no shared expert, MoE in
# every layer). Values: public copies of its config.json (the M2 / M2.5 line shares these fields; auto_map dropped:
# transformers has the class).
MINIMAX_M2 = {
    'architectures': ['MiniMaxM2ForCausalLM'], 'attn_type_list': [1] * 62, 'head_dim': 128, 'hidden_act': 'silu',
    'hidden_size': 3072, 'intermediate_size': 1536, 'max_position_embeddings': 196608, 'model_type': 'minimax_m2',
    'mtp_transformer_layers': 1, 'num_attention_heads': 48, 'num_experts_per_tok': 8, 'num_hidden_layers': 62,
    'num_key_value_heads': 8, 'num_local_experts': 256, 'num_mtp_modules': 3, 'qk_norm_type': 'per_layer',
    'rms_norm_eps': 1e-06, 'rope_theta': 5000000, 'rotary_dim': 64, 'scoring_func': 'sigmoid',
    'shared_intermediate_size': 0, 'tie_word_embeddings': False, 'torch_dtype': 'bfloat16', 'use_cache': True,
    'use_mtp': True, 'use_qk_norm': True, 'use_routing_bias': True, 'vocab_size': 200064,
}  # yapf: disable
# tencent/Hy3-preview (hy_v3, Hunyuan-V3: per-head QK-norm, sigmoid routing with expert bias, top-8 of 192
# renormalised and scaled by 2.826, one shared expert, a dense first layer; 1 MTP layer). Values: public copies of its
# config.json (the fields transformers' HYV3Config, whose defaults are this checkpoint, and mcore-bridge read).
HY3_PREVIEW = {
    'architectures': ['HYV3ForCausalLM'], 'enable_attention_fp32_softmax': False, 'enable_lm_head_fp32': True,
    'enable_moe_fp32_combine': False, 'expert_hidden_dim': 1536, 'first_k_dense_replace': 1, 'head_dim': 128,
    'hidden_act': 'silu', 'hidden_size': 4096, 'initializer_range': 0.006, 'intermediate_size': 13312,
    'max_position_embeddings': 262144, 'model_type': 'hy_v3', 'moe_intermediate_size': 1536,
    'moe_router_enable_expert_bias': True, 'moe_router_use_sigmoid': True, 'num_attention_heads': 64,
    'num_experts': 192, 'num_experts_per_tok': 8, 'num_hidden_layers': 80, 'num_key_value_heads': 8,
    'num_nextn_predict_layers': 1, 'num_shared_experts': 1, 'output_router_logits': True, 'qk_norm': True,
    'rms_norm_eps': 1e-05, 'rope_parameters': {'rope_theta': 11158840.0, 'rope_type': 'default'}, 'route_norm': True,
    'router_scaling_factor': 2.826, 'tie_word_embeddings': False, 'torch_dtype': 'bfloat16', 'use_cache': True,
    'vocab_size': 120832,
}  # yapf: disable
# inclusionAI/Ling-mini-2.0 (bailing_moe, Ling 2.0: fused QKV, per-head QK-norm, partial rotary 0.5, sigmoid routing
# with expert bias, top-8 of 256 within 4 of 8 groups, renormalised and scaled by 2.5, one shared expert, a dense
# first layer). transformers has no class: built and run as tests/harness/bailing_moe.py writes its published modeling
# code. Values: the config.json keys inclusionAI/Ling-V2 writes (tools/convert_dcp_to_safetensors.py) with the values
# of its BailingMoeV2Config defaults (this checkpoint; 16.3 B parameters) and the model card.
LING_MINI_20 = {
    'architectures': ['BailingMoeV2ForCausalLM'], 'attention_dropout': 0.0,
    'auto_map': {'AutoConfig': 'configuration_bailing_moe_v2.BailingMoeV2Config'},  # (its modeling entries dropped)
    'embedding_dropout': 0.0,
    'eos_token_id': 156892, 'first_k_dense_replace': 1, 'head_dim': 128, 'hidden_act': 'silu', 'hidden_size': 2048,
    'initializer_range': 0.02, 'intermediate_size': 5120, 'max_position_embeddings': 32768,
    'model_type': 'bailing_moe', 'moe_intermediate_size': 512, 'moe_router_enable_expert_bias': True,
    'moe_shared_expert_intermediate_size': 512, 'n_group': 8, 'norm_topk_prob': True, 'num_attention_heads': 16,
    'num_experts': 256, 'num_experts_per_tok': 8, 'num_hidden_layers': 20, 'num_key_value_heads': 4,
    'num_shared_experts': 1, 'output_dropout': 0.0, 'pad_token_id': 156892, 'partial_rotary_factor': 0.5,
    'rms_norm_eps': 1e-06, 'rope_scaling': None, 'rope_theta': 600000.0, 'routed_scaling_factor': 2.5,
    'router_dtype': 'fp32', 'score_function': 'sigmoid', 'tie_word_embeddings': False, 'topk_group': 4,
    'torch_dtype': 'bfloat16', 'use_bias': False, 'use_cache': True, 'use_qk_norm': True, 'use_qkv_bias': False,
    'use_rmsnorm': True, 'vocab_size': 157184,
}  # yapf: disable
# Qwen/Qwen3-VL-8B-Instruct (qwen3_vl, Qwen3VLForConditionalGeneration: the Qwen3 decoder (QK-norm, GQA 32 / 8 heads)
# with interleaved multimodal RoPE [24, 20, 20], theta 5e6, under a 27-block ViT whose deepstack mergers (after blocks
# 8, 16, 24) add image features to the first 3 text layers' image tokens; untied; 8.77 B). Written from the published
# config.json (text_config / vision_config as the hub file has them; transformers_version dropped).
QWEN3_VL_8B = {
    'architectures': ['Qwen3VLForConditionalGeneration'], 'image_token_id': 151655, 'model_type': 'qwen3_vl',
    'text_config': {
        'attention_bias': False, 'attention_dropout': 0.0, 'bos_token_id': 151643, 'dtype': 'bfloat16',
        'eos_token_id': 151645, 'head_dim': 128, 'hidden_act': 'silu', 'hidden_size': 4096,
        'initializer_range': 0.02, 'intermediate_size': 12288, 'max_position_embeddings': 262144,
        'model_type': 'qwen3_vl_text', 'num_attention_heads': 32, 'num_hidden_layers': 36, 'num_key_value_heads': 8,
        'rms_norm_eps': 1e-06,
        'rope_scaling': {'mrope_interleaved': True, 'mrope_section': [24, 20, 20], 'rope_type': 'default'},
        'rope_theta': 5000000, 'use_cache': True, 'vocab_size': 151936,
    },
    'tie_word_embeddings': False, 'video_token_id': 151656,
    'vision_config': {
        'deepstack_visual_indexes': [8, 16, 24], 'depth': 27, 'hidden_act': 'gelu_pytorch_tanh', 'hidden_size': 1152,
        'in_channels': 3, 'initializer_range': 0.02, 'intermediate_size': 4304, 'model_type': 'qwen3_vl',
        'num_heads': 16, 'num_position_embeddings': 2304, 'out_hidden_size': 4096, 'patch_size': 16,
        'spatial_merge_size': 2, 'temporal_patch_size': 2,
    },
    'vision_end_token_id': 151653, 'vision_start_token_id': 151652,
}  # yapf: disable


def hybrid_layer_types(n, interval=4):
    """`layer_types` of a Gated-DeltaNet hybrid: every interval-th layer full attention, the others linear."""
    return ['full_attention' if (i + 1) % interval == 0 else 'linear_attention' for i in range(n)]


# Qwen/Qwen3-Next-80B-A3B-Instruct (qwen3_next: 3 of every 4 layers Gated DeltaNet, the 4th gated attention with
# partial rotary 0.25; 512 experts top-10 + a gated shared expert, every layer MoE). Values: its config.json (the
# fields the issue lists; intermediate_size, unused with every layer MoE, and the token ids from public copies).
QWEN3_NEXT_80B_A3B = {
    'architectures': ['Qwen3NextForCausalLM'], 'attention_bias': False, 'attention_dropout': 0.0,
    'bos_token_id': 151643, 'decoder_sparse_step': 1, 'eos_token_id': 151645, 'full_attention_interval': 4,
    'head_dim': 256, 'hidden_act': 'silu', 'hidden_size': 2048, 'initializer_range': 0.02, 'intermediate_size': 5120,
    'linear_conv_kernel_dim': 4, 'linear_key_head_dim': 128, 'linear_num_key_heads': 16, 'linear_num_value_heads': 32,
    'linear_value_head_dim': 128, 'max_position_embeddings': 262144, 'mlp_only_layers': [], 'model_type': 'qwen3_next',
    'moe_intermediate_size': 512, 'norm_topk_prob': True, 'num_attention_heads': 16, 'num_experts': 512,
    'num_experts_per_tok': 10, 'num_hidden_layers': 48, 'num_key_value_heads': 2, 'output_router_logits': False,
    'partial_rotary_factor': 0.25, 'rms_norm_eps': 1e-06, 'rope_scaling': None, 'rope_theta': 10000000,
    'router_aux_loss_coef': 0.001, 'shared_expert_intermediate_size': 512, 'tie_word_embeddings': False,
    'torch_dtype': 'bfloat16', 'use_cache': True, 'use_sliding_window': False, 'vocab_size': 151936,
}  # yapf: disable
# Qwen3.5 (Qwen3_5ForConditionalGeneration / Qwen3_5MoeForConditionalGeneration): a multimodal checkpoint whose
# language model is the hybrid (3 Gated DeltaNet : 1 gated attention, partial rotary 0.25, interleaved multimodal
# RoPE [11, 11, 10], theta 1e7), vocabulary 248320, untied; a 27-block ViT. Values: the model cards' architecture
# tables and public Megatron argument files of these checkpoints (hidden / layers / heads / FFN / experts); the
# token ids, the vision block and the remaining text fields as transformers' Qwen3.5 configuration defaults and public
# copies of the config.json give them (not read off the hub here: these are the uncertain ones).
QWEN35_ROPE = {'mrope_interleaved': True, 'mrope_section': [11, 11, 10], 'rope_type': 'default',
               'rope_theta': 10000000, 'partial_rotary_factor': 0.25}
QWEN35_VISION = {
    'deepstack_visual_indexes': [], 'depth': 27, 'hidden_act': 'gelu_pytorch_tanh', 'hidden_size': 1152,
    'in_channels': 3, 'initializer_range': 0.02, 'intermediate_size': 4304, 'num_heads': 16,
    'num_position_embeddings': 2304, 'patch_size': 16, 'spatial_merge_size': 2, 'temporal_patch_size': 2,
}  # yapf: disable
QWEN35_MEDIA_IDS = {'image_token_id': 248056, 'video_token_id': 248057, 'vision_start_token_id': 248053,
                    'vision_end_token_id': 248054}
QWEN35_TEXT = {
    'attention_bias': False, 'attention_dropout': 0.0, 'attn_output_gate': True, 'eos_token_id': 248044,
    'full_attention_interval': 4, 'head_dim': 256, 'hidden_act': 'silu', 'initializer_range': 0.02,
    'linear_conv_kernel_dim': 4, 'linear_key_head_dim': 128, 'linear_num_key_heads': 16, 'linear_value_head_dim': 128,
    'max_position_embeddings': 262144, 'mtp_num_hidden_layers': 1, 'mtp_use_dedicated_embeddings': False,
    'rms_norm_eps': 1e-06, 'rope_parameters': QWEN35_ROPE, 'use_cache': True, 'vocab_size': 248320,
}  # yapf: disable
# Qwen/Qwen3.5-27B (dense): hidden 5120, 64 layers, 24 heads / 4 kv heads, FFN 17408, 48 linear value heads.
QWEN35_27B = {
    'architectures': ['Qwen3_5ForConditionalGeneration'], 'model_type': 'qwen3_5', **QWEN35_MEDIA_IDS,
    'text_config': dict(QWEN35_TEXT, model_type='qwen3_5_text', hidden_size=5120, intermediate_size=17408,
                        num_hidden_layers=64, layer_types=hybrid_layer_types(64), num_attention_heads=24,
                        num_key_value_heads=4, linear_num_value_heads=48),
    'tie_word_embeddings': False, 'torch_dtype': 'bfloat16',
    'vision_config': dict(QWEN35_VISION, model_type='qwen3_5', out_hidden_size=5120),
}  # yapf: disable
# Qwen/Qwen3.5-35B-A3B (MoE): hidden 2048, 40 layers, 16 heads / 2 kv heads, 256 experts (FFN 512) top-8 + a gated
# shared expert (512), 32 linear value heads.
QWEN35_35B_A3B = {
    'architectures': ['Qwen3_5MoeForConditionalGeneration'], 'model_type': 'qwen3_5_moe', **QWEN35_MEDIA_IDS,
    'text_config': dict(QWEN35_TEXT, model_type='qwen3_5_moe_text', hidden_size=2048, num_hidden_layers=40,
                        layer_types=hybrid_layer_types(40), num_attention_heads=16, num_key_value_heads=2,
                        linear_num_value_heads=32, moe_intermediate_size=512, num_experts=256, num_experts_per_tok=8,
                        router_aux_loss_coef=0.001, shared_expert_intermediate_size=512),
    'tie_word_embeddings': False, 'torch_dtype': 'bfloat16',
    'vision_config': dict(QWEN35_VISION, model_type='qwen3_5_moe', out_hidden_size=2048),
}  # yapf: disable

TINY_IDS = dict(bos_token_id=1, eos_token_id=2)  # the tiny tokenizer's <s> and </s>
# Qwen3.5 cuts (applied to text_config / vision_config): 4 layers keep one full-attention layer; no MTP layer; a
# vision tower of one block at hidden 128 (out_hidden_size stays the text width). Toy widths for --tiny; media token
# ids past the tiny tokenizer's ids (the random parity ids stay below them).
HYBRID_CUT = dict(num_hidden_layers=4, layer_types=hybrid_layer_types(4), mtp_num_hidden_layers=0)
VISION_CUT = dict(depth=1, hidden_size=128, intermediate_size=256, num_heads=2)
HYBRID_TOY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
                  linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, vocab_size=512,
                  **TINY_IDS)
VISION_TOY = dict(hidden_size=32, intermediate_size=64, out_hidden_size=64, patch_size=4, num_position_embeddings=64)
TINY_MEDIA_IDS = dict(image_token_id=508, video_token_id=509, vision_start_token_id=510, vision_end_token_id=511)

# name -> (published config, cut: the fields changed to fit one 80 GB GPU, toy widths for --tiny)
FAMILIES = {
    'qwen2.5-1.5b': (QWEN25_15B, {}, dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=512, sliding_window=512, max_window_layers=2, **TINY_IDS)),
    'qwen3-1.7b': (QWEN3_17B, {}, dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, vocab_size=512, max_window_layers=2, **TINY_IDS)),
    # 4 of 48 layers, all 128 experts (top-8): 3.1 B parameters
    'qwen3-30b-a3b-cut': (QWEN3_30B_A3B, dict(num_hidden_layers=4, max_window_layers=4), dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=2, vocab_size=512,
        max_window_layers=2, **TINY_IDS)),
    # 3 of 61 layers (1 dense, first_k_dense_replace=1, then 2 MoE), 16 of 256 routed experts, top-8 within 3 of 4
    # groups (4 experts a group: group-limited routing still chooses); no MTP layer saved: 4.3 B parameters.
    # Keep num_experts_per_tok // topk_group == 2: megatron scores a group by its top (topk // topk_group) experts,
    # transformers by its top 2 (they agree on the published 8 // 4).
    'deepseek-v3-cut': (DEEPSEEK_V3, dict(num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=16,
                                          n_group=4, topk_group=3, num_nextn_predict_layers=0), dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=4,
        vocab_size=512, **TINY_IDS)),
    # 4 of 24 layers, all 60 experts: 2.9 B parameters
    'qwen1.5-moe-a2.7b-cut': (QWEN15_MOE_A27B, dict(num_hidden_layers=4, max_window_layers=4), dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
        vocab_size=512, max_window_layers=2, **TINY_IDS)),
    # 3 of 46 layers (1 dense, then 2 MoE), 64 of 128 experts (top-8, one group), no MTP layer: 4.0 B
    'glm-4.5-air-cut': (GLM45_AIR, dict(num_hidden_layers=3, n_routed_experts=64, num_nextn_predict_layers=0), dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, head_dim=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, n_routed_experts=8, num_experts_per_tok=2, vocab_size=512,
        pad_token_id=0, **TINY_IDS)),
    # 4 of 47 layers (1 dense, then 3 MoE), all 64 experts, no MTP layer: 2.6 B
    'glm-4.7-flash-cut': (GLM47_FLASH, dict(num_hidden_layers=4, num_nextn_predict_layers=0), dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16,
        v_head_dim=32, n_routed_experts=8, num_experts_per_tok=2, vocab_size=512, pad_token_id=0, **TINY_IDS)),
    # 4 of 27 layers (1 dense, then 3 MoE), all 64 experts: 2.3 B
    'deepseek-v2-lite-cut': (DEEPSEEK_V2_LITE, dict(num_hidden_layers=4), dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
        n_routed_experts=8, num_experts_per_tok=2, vocab_size=512, **TINY_IDS)),
    # whole: 1.24 B
    'llama-3.2-1b': (LLAMA32_1B, {}, dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=512, **TINY_IDS)),
    # 4 of 28 layers (1 dense, then 3 MoE), all 64 experts: 2.8 B
    'ernie-4.5-21b-a3b-cut': (ERNIE45_21B_A3B, dict(num_hidden_layers=4, moe_layer_end_index=3), dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, moe_num_experts=8, moe_k=2, moe_layer_end_index=1, vocab_size=512,
        **TINY_IDS)),
    # whole: 0.36 B
    'ernie-4.5-0.3b': (ERNIE45_03B, {}, dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, vocab_size=512, **TINY_IDS)),
    # 3 of 62 layers (1 dense, then 2 MoE), 64 of 128 experts (top-6): 3.9 B
    'dots.llm1-cut': (DOTS_LLM1, dict(num_hidden_layers=3, n_routed_experts=64), dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, vocab_size=512, **TINY_IDS)),
    # 3 of 61 layers (1 dense, then 2 MoE), 16 of 384 experts (top-8, one group): 4.5 B
    'kimi-k2-cut': (KIMI_K2, dict(num_hidden_layers=3, n_routed_experts=16), dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, vocab_size=512,
        **TINY_IDS)),
    # --- the Gated-DeltaNet hybrids (mcore-bridge builds them as qwen3_next / qwen3_5, PLT as <type>_plt) ---
    # 4 of 48 layers (3 Gated DeltaNet + 1 gated attention), 128 of 512 experts (top-10, the shared expert): 2.4 B,
    # which also trains with Adam on one 80 GB GPU (the throughput benchmark); 256 experts (4.0 B) would not
    'qwen3-next-80b-a3b-cut': (QWEN3_NEXT_80B_A3B, dict(num_hidden_layers=4, num_experts=128), dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=64,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, num_experts=8, num_experts_per_tok=2, vocab_size=512,
        **TINY_IDS)),
    # text: 4 of 64 layers (3 + 1 full attention), no MTP layer; vision: 1 small block: 4.1 B (2.5 B of it the
    # 248320-row embedding and LM head)
    'qwen3.5-27b-cut': (QWEN35_27B, dict(text_config=HYBRID_CUT, vision_config=VISION_CUT), dict(
        text_config=dict(HYBRID_TOY, intermediate_size=128), vision_config=VISION_TOY, **TINY_MEDIA_IDS)),
    # text: 4 of 40 layers, 128 of 256 experts (top-8, the shared expert), no MTP layer; vision: 1 small block: 2.7 B
    'qwen3.5-35b-a3b-cut': (QWEN35_35B_A3B, dict(text_config=dict(HYBRID_CUT, num_experts=128),
                                                 vision_config=VISION_CUT), dict(
        text_config=dict(HYBRID_TOY, moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=8,
                         num_experts_per_tok=2), vision_config=VISION_TOY, **TINY_MEDIA_IDS)),
    # --- mcore-bridge's own decoder types and GPT-OSS (group `new`; GPT-OSS built as `gpt_plt`, the others as
    # mcore-bridge's own `<type>_plt`) ---
    # 4 of 24 layers (2 sliding-window + 2 full attention), all 32 experts (top-4): 4.4 B. The toy window of 8 tokens
    # is 2 patches at K=4, shorter than the dry run's 64-token rows (the published 128 is 32 patches of 64)
    'gpt-oss-20b-cut': (GPT_OSS_20B, dict(num_hidden_layers=4, layer_types=['sliding_attention', 'full_attention'] * 2),
                        dict(hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                             layer_types=['sliding_attention', 'full_attention'], num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
                             experts_per_token=2, sliding_window=8, vocab_size=512, pad_token_id=0, **TINY_IDS)),
    # 4 of 16 layers, all 64 experts (top-8): 1.9 B
    'olmoe-1b-7b-cut': (OLMOE_1B_7B, dict(num_hidden_layers=4), dict(
        hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        num_experts=8, num_experts_per_tok=2, vocab_size=512, **TINY_IDS)),
    # 4 of 40 layers: 2.1 B (1.2 B of it the embedding and LM head)
    'glm-4-9b-0414-cut': (GLM4_9B_0414, dict(num_hidden_layers=4), dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, vocab_size=512, pad_token_id=0, **TINY_IDS)),
    # 3 of 62 layers (all MoE), 64 of 256 experts (top-8): 4.0 B
    'minimax-m2-cut': (MINIMAX_M2, dict(num_hidden_layers=3, attn_type_list=[1] * 3, num_local_experts=64), dict(
        hidden_size=64, intermediate_size=32, num_hidden_layers=2, attn_type_list=[1] * 2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, rotary_dim=16, num_local_experts=8, num_experts_per_tok=2,
        vocab_size=512, **TINY_IDS)),
    # 3 of 80 layers (1 dense, then 2 MoE), 64 of 192 experts (top-8, the shared expert), no MTP layer: 3.8 B
    'hy3-preview-cut': (HY3_PREVIEW, dict(num_hidden_layers=3, num_experts=64, num_nextn_predict_layers=0), dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, expert_hidden_dim=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=2,
        vocab_size=512, **TINY_IDS)),
    # 4 of 20 layers (1 dense, then 3 MoE), all 256 experts (top-8 within 4 of 8 groups, the shared expert): 3.1 B
    'ling-mini-2.0-cut': (LING_MINI_20, dict(num_hidden_layers=4), dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, moe_shared_expert_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8,
        num_experts_per_tok=2, n_group=2, topk_group=1, vocab_size=512, pad_token_id=0, **TINY_IDS)),
    # Qwen3-VL (qwen3_vl: multimodal, its language model trained on text, as Qwen3.5's; PLT as qwen3_vl_plt,
    # PLTMultimodalGPTModel). Text: 4 of 36 layers; vision: 3 small blocks, each feeding a deepstack merger (the
    # published 3, into text layers 0-2: mcore-bridge asserts no more of them than text layers), hidden 128: 2.0 B
    # (1.2 B of it the embedding and LM head)
    'qwen3-vl-8b-cut': (QWEN3_VL_8B, dict(text_config=dict(num_hidden_layers=4), vision_config=dict(
        VISION_CUT, depth=3, deepstack_visual_indexes=[0, 1, 2])), dict(
        text_config=dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, vocab_size=512, **TINY_IDS,
                         rope_scaling=dict(mrope_interleaved=True, mrope_section=[4, 6, 6], rope_type='default')),
        vision_config=VISION_TOY, **TINY_MEDIA_IDS)),
}  # yapf: disable
NAMES = list(FAMILIES)
DEFAULT = NAMES[:4]  # families.sh's default run (one H100, ~6 min)


def _record(name):
    from swift_plt import families  # the family records (no torch)
    return families.family(FAMILIES[name][0]['model_type'])


# the Gated-DeltaNet hybrids; the families with their own mcore-bridge type or attention sinks (FAMILIES=new)
HYBRID = [n for n in NAMES if _record(n).linear_attention]
NEW = [n for n in NAMES if n not in HYBRID and (_record(n).mcore_type != 'gpt' or _record(n).attention_sinks)]
MORE = [n for n in NAMES[4:] if n not in HYBRID + NEW]  # the other `gpt` families (FAMILIES=more)
GROUPS = dict(default=DEFAULT, more=MORE, hybrid=HYBRID, new=NEW, all=NAMES)
# model types transformers has no class for -> the tests/harness module that writes out their published modeling code
HAND_WRITTEN = {'bailing_moe': 'bailing_moe'}
MULTIMODAL_KEYS = ('text_config', 'vision_config')  # a cut or toy entry of these updates that sub-config
# ERNIE-4.5-MoE routes by softmax scores plus moe_statics.e_score_correction_bias; megatron-core 0.16.1 adds an expert
# bias to sigmoid scores only and mcore-bridge 1.6.5 does not load this one, so the stock Megatron model routes
# without it (K=1 as at K > 1). Kept 0 here: the parity then compares what both sides compute.
NO_ROUTER_BIAS = ('ernie4_5_moe', )
TRAIN_BYTES_PER_PARAM = 18  # megatron bf16 + Adam: bf16 param 2, fp32 grad 4, fp32 master 4, Adam m and v 8


def family_config(name, tiny=False, layers=None):
    """The config.json dict of NAME: published, with the cut (and with --tiny the toy widths) applied; ``layers``:
    that many layers instead of the cut's (a model for several GPUs; not for the hybrids' layer pattern)."""
    real, cut, toy = FAMILIES[name]
    cfg = copy.deepcopy(real)
    if layers:
        if name in HYBRID:
            raise ValueError(f'{name}: --layers is for the `gpt` families (a hybrid keeps its layer pattern)')
        cut = dict(cut, num_hidden_layers=layers)
        if 'max_window_layers' in cut:  # Qwen's sliding-window start: past the last layer, as the cut has it
            cut['max_window_layers'] = layers
    for change in (cut, toy) if tiny else (cut, ):
        for key, value in copy.deepcopy(change).items():
            if key in MULTIMODAL_KEYS:
                cfg[key].update(value)
            else:
                cfg[key] = value
    if (cfg.get('n_group') or 1) > 1 and cfg['num_experts_per_tok'] // cfg['topk_group'] != 2:
        raise ValueError(f'{name}: num_experts_per_tok // topk_group must be 2 (megatron and HF group scores agree)')
    return cfg


def text_config(cfg):
    """The language model's fields of a config.json dict: its text_config (multimodal checkpoints) or itself."""
    return cfg.get('text_config') or cfg


def harness_module(name):
    """tests/harness/NAME.py, imported as plain code (nothing of the CPU harness is installed)."""
    import importlib
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if tests not in sys.path:
        sys.path.append(tests)  # appended: never shadows anything installed
    return importlib.import_module(f'harness.{name}')


def hand_written(model_type):
    """tests/harness's module of a model type transformers has no class for (HAND_WRITTEN), else None."""
    return harness_module(HAND_WRITTEN[model_type]) if model_type in HAND_WRITTEN else None


def model_class(cfg):
    """The HF class a checkpoint of cfg is: the multimodal one named in `architectures` (transformers'
    AutoModelForCausalLM would pick the text-only class for Qwen3.5), the hand-written one (HAND_WRITTEN), else
    AutoModelForCausalLM."""
    import transformers
    module = hand_written(cfg['model_type'])
    if module:
        return getattr(module, cfg['architectures'][0])
    if 'text_config' in cfg:
        return getattr(transformers, cfg['architectures'][0])
    return transformers.AutoModelForCausalLM


def build_model(cfg, dtype=None):
    """HF's random init of cfg's model (on the current default device), in dtype."""
    cls = model_class(cfg)
    if hand_written(cfg['model_type']):
        model = cls(cfg)
        model.init_weights()
        return model if dtype is None else model.to(dtype)
    make = cls.from_config if hasattr(cls, 'from_config') else cls._from_config
    if dtype is None:
        return make(hf_config(cfg))
    try:
        return make(hf_config(cfg), dtype=dtype)
    except TypeError:  # transformers 4.x
        return make(hf_config(cfg), torch_dtype=dtype)


def buildable(name):
    """Whether this environment builds NAME's model: the installed transformers has its model type (transformers
    4.57 has no glm4_moe_lite), or it is HAND_WRITTEN."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    model_type = FAMILIES[name][0]['model_type']
    return model_type in CONFIG_MAPPING_NAMES or model_type in HAND_WRITTEN


def hf_config(cfg):
    from transformers import AutoConfig
    kw = {k: copy.deepcopy(v) for k, v in cfg.items() if k != 'model_type'}  # transformers edits rope_scaling
    return AutoConfig.for_model(cfg['model_type'], **kw)


def count_params(cfg):
    """(parameters, of which embedding + LM head) of NAME's config, built on the meta device (no memory)."""
    import torch

    from swift_plt.compat.transformers import hf_rope_guard
    with hf_rope_guard(), torch.device('meta'):
        model = build_model(cfg)
    n = sum(p.numel() for p in model.parameters())  # a tied LM head is the embedding: counted once
    text = text_config(cfg)
    emb = text['vocab_size'] * text['hidden_size'] * (1 if cfg.get('tie_word_embeddings') else 2)
    return n, emb


def sizes(cfg):
    n, emb = count_params(cfg)
    gb = 1e9
    return dict(params=n, embedding_and_head=emb, bf16_gb=2 * n / gb, fp32_gb=4 * n / gb, fp64_gb=8 * n / gb,
                train_bf16_adam_gb=TRAIN_BYTES_PER_PARAM * n / gb)


def size_line(name, s):
    return (f'{name}: {s["params"] / 1e9:.4g} B params ({s["embedding_and_head"] / 1e9:.4g} B embedding + head); '
            f'bf16 {s["bf16_gb"]:.3g} GB on disk, fp32 {s["fp32_gb"]:.3g} GB (HF reference / Megatron fp32), '
            f'fp64 {s["fp64_gb"]:.3g} GB, training bf16+Adam ~{s["train_bf16_adam_gb"]:.3g} GB + activations')


def make_tokenizer(out_dir):
    """The tiny BPE tokenizer (swift_plt.tools.tiny; ids < 512 < every vocab here) in out_dir."""
    from swift_plt.tools.tiny import make_tiny_llama
    with tempfile.TemporaryDirectory() as tmp:
        make_tiny_llama(tmp, max_position_embeddings=32768)
        os.makedirs(out_dir, exist_ok=True)
        for f in os.listdir(tmp):
            if f.startswith(('tokenizer', 'special_tokens')):
                shutil.copy(os.path.join(tmp, f), out_dir)
    return out_dir


def randomize(model, seed):
    """Biases (GPT-OSS's expert biases too) N(0, 0.02), RMSNorm weights 1 + N(0, 0.1), the routers' expert bias
    (e_score_correction_bias, Ling 2.0's expert_bias; but NO_ROUTER_BIAS) N(0, 0.01), GPT-OSS's attention sinks N(0, 1)
    (of order 1: a visible share of each softmax): HF leaves them 0 / 1 / N(0, initializer_range), which would hide a
    bias, norm or sink the bridge drops or swaps."""
    import torch
    g = torch.Generator(device='cpu').manual_seed(seed + 1)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if 'rotary' in name or 'inv_freq' in name:
                continue
            if name.endswith(('e_score_correction_bias', '.expert_bias')):  # fp32, as the routers score
                if model.config.model_type in NO_ROUTER_BIAS:
                    continue
                std, base = 0.01, 0.0
                owner, _, attr = name.rpartition('.')
                owner = model.get_submodule(owner)
                t = t.float()
                if attr in owner._parameters:
                    owner.register_parameter(attr, torch.nn.Parameter(t, requires_grad=False))
                else:
                    owner.register_buffer(attr, t)
            elif name.endswith(('.bias', '_proj_bias')):
                std, base = 0.02, 0.0
            elif name.endswith('.sinks'):
                std, base = 1.0, 0.0
            elif t.dim() == 1 and 'norm' in name:
                std, base = 0.1, 1.0
            else:
                continue
            t.copy_((base + std * torch.randn(t.shape, generator=g)).to(t.dtype))


def _text_only_multimodal(cfg):
    """Whether cfg is a multimodal checkpoint whose language model PLT trains on text (the family record's flag:
    Qwen3.5, Qwen3-VL)."""
    from swift_plt import families
    record = families.family(cfg['model_type'])
    return bool(record and record.text_only_multimodal)


def write_qwen3_5_processor(out_dir):
    """preprocessor_config.json / video_preprocessor_config.json as Qwen3-VL's and Qwen3.5's hub checkpoints ship
    them (Qwen3VLProcessor)."""
    image = {'size': {'longest_edge': 16777216, 'shortest_edge': 65536}, 'patch_size': 16, 'temporal_patch_size': 2,
             'merge_size': 2, 'image_mean': [0.5, 0.5, 0.5], 'image_std': [0.5, 0.5, 0.5],
             'processor_class': 'Qwen3VLProcessor', 'image_processor_type': 'Qwen2VLImageProcessorFast'}
    video = dict(image, size={'longest_edge': 25165824, 'shortest_edge': 4096}, fps=2, min_frames=4, max_frames=768,
                 do_sample_frames=True, video_processor_type='Qwen3VLVideoProcessor')
    del video['image_processor_type']
    for name, d in (('preprocessor_config.json', image), ('video_preprocessor_config.json', video)):
        with open(os.path.join(out_dir, name), 'w') as f:
            json.dump(d, f, indent=2)


def write_model(name, out_dir, tok_dir, device='cpu', tiny=False, seed=0, layers=None):
    """Write NAME's random-init model dir; return its config dict."""
    import torch

    from swift_plt.compat.transformers import hf_rope_guard
    cfg = family_config(name, tiny, layers)
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(seed)
    with hf_rope_guard(), torch.device(device):
        model = build_model(cfg, torch.bfloat16)
    randomize(model, seed)
    model.save_pretrained(out_dir, safe_serialization=True)
    del model
    if _text_only_multimodal(cfg):  # ms-swift loads the checkpoint's processor (Qwen3-VL's, Qwen3.5's too)
        write_qwen3_5_processor(out_dir)
    # the published format, not transformers' re-dump (transformers 5 drops full_attention_interval, which
    # mcore-bridge reads for the hybrids' layer pattern)
    with open(os.path.join(out_dir, 'config.json'), 'w') as f:
        json.dump(cfg, f, indent=2)
    if 'AutoConfig' in cfg.get('auto_map', {}):  # remote code (Ling 2.0): ms-swift reads config.json through it
        module, cls = cfg['auto_map']['AutoConfig'].split('.')
        with open(os.path.join(out_dir, module + '.py'), 'w') as f:
            f.write(f'from transformers import PretrainedConfig\n\n\nclass {cls}(PretrainedConfig):\n'
                    f'    model_type = {cfg["model_type"]!r}\n')
    for f in os.listdir(tok_dir):
        if f.startswith(('tokenizer', 'special_tokens')):
            shutil.copy(os.path.join(tok_dir, f), out_dir)
    return cfg


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--out', help='parent dir: one sub-dir per model')
    ap.add_argument('--only', default='all', help=f'comma list of {", ".join(NAMES)} or of the groups '
                    f'{", ".join(GROUPS)}')
    ap.add_argument('--device', default=None, help='where the weights are initialised (default cuda if available)')
    ap.add_argument('--tiny', action='store_true', help='toy widths, same structure (CPU tests)')
    ap.add_argument('--estimate', action='store_true', help='print the sizes only')
    ap.add_argument('--list', action='store_true', help='print the names --only selects (comma list) and exit')
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--layers', type=int, default=None, help="that many layers instead of the cut's (e.g. the "
                    'Qwen3-30B-A3B with all 128 experts on 4 GPUs); dir name unchanged')
    ap.add_argument('--json', default=None, help='write {name: {dir, sizes}} here')
    a = ap.parse_args(argv)
    names = [n.strip() for n in a.only.split(',') if n.strip()]
    names = list(dict.fromkeys(m for n in names for m in GROUPS.get(n, [n])))
    bad = [n for n in names if n not in FAMILIES]
    if bad:
        ap.error(f'unknown {bad}; known: {NAMES}')
    if a.list:
        print(','.join(names))
        return 0
    if not a.estimate and not a.out:
        ap.error('--out is required (or --estimate)')
    import torch
    device = a.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    report = {}
    tok_dir = None
    if not a.estimate:
        tok_dir = make_tokenizer(os.path.join(a.out, '_tokenizer'))
    for name in names:
        s = sizes(family_config(name, a.tiny, a.layers))
        report[name] = dict(sizes=s)
        print(size_line(name, s), flush=True)
        if a.estimate:
            continue
        t = time.time()
        d = os.path.join(a.out, name)
        cfg = write_model(name, d, tok_dir, device, a.tiny, a.seed, a.layers)
        report[name].update(dir=d, model_type=cfg['model_type'])
        print(f'model: {name} ({cfg["model_type"]}) -> {d} in {time.time() - t:.1f} s', flush=True)
        if device.startswith('cuda'):
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, 'w') as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == '__main__':
    sys.exit(main())
