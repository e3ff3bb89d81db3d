"""Ling/Ring 2.0 (``model_type: bailing_moe``, ``BailingMoeV2ForCausalLM``) written out by hand: transformers has no
class for it and its checkpoints bring their own modeling code. Written from inclusionAI's published file,
github.com/inclusionAI/Ling-V2, models/modeling_bailing_moe_v2.py (decoder, attention, gate, MoE block, RMSNorm,
RoPE; eager attention, no cache, no MTP layers), as the HF-side reference the tests hold mcore-bridge's
``bailing_moe`` type against, with a tiny checkpoint writer in that model's names."""
import json
import math
import os
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

MODEL_TYPE = 'bailing_moe'
ARCHITECTURE = 'BailingMoeV2ForCausalLM'


def is_bailing_moe(hf_dir: str) -> bool:
    with open(os.path.join(hf_dir, 'config.json')) as f:
        return json.load(f).get('model_type') == MODEL_TYPE


def register_config() -> None:
    """Let ``AutoConfig.from_pretrained`` read a ``bailing_moe`` config.json (a real run loads the checkpoint's own
    configuration class with trust_remote_code); idempotent."""
    from transformers import AutoConfig, PretrainedConfig
    try:
        AutoConfig.for_model(MODEL_TYPE)
        return
    except ValueError:
        pass

    class BailingMoeV2Config(PretrainedConfig):
        model_type = MODEL_TYPE

    AutoConfig.register(MODEL_TYPE, BailingMoeV2Config)


class RMSNorm(nn.Module):

    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    x1, x2 = x[..., :x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class MLP(nn.Module):

    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Gate(nn.Module):
    """Sigmoid scores; experts chosen on scores + expert_bias within the top ``topk_group`` of ``n_group`` groups (a
    group scored by the sum of its top 2); weights = the chosen plain scores renormalised, times
    ``routed_scaling_factor``."""

    def __init__(self, c):
        super().__init__()
        self.top_k, self.num_experts = c['num_experts_per_tok'], c['num_experts']
        self.n_group, self.topk_group = c['n_group'], c['topk_group']
        self.scale = c['routed_scaling_factor']
        self.weight = nn.Parameter(torch.empty(self.num_experts, c['hidden_size']))
        self.register_buffer('expert_bias', torch.zeros(self.num_experts))

    def forward(self, x):
        logits = F.linear(x.float(), self.weight.float())
        scores = torch.sigmoid(logits)
        routing = scores + self.expert_bias
        n = routing.shape[0]
        group_scores = routing.view(n, self.n_group, -1).topk(2, dim=-1)[0].sum(-1)
        group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(n, self.n_group, self.num_experts // self.n_group).reshape(n, -1)
        idx = torch.topk(routing.masked_fill(~score_mask.bool(), float('-inf')), k=self.top_k, dim=-1)[1]
        weight = torch.gather(scores, 1, idx)
        if self.top_k > 1:
            weight = weight / (weight.sum(-1, keepdim=True) + 1e-20)
        return idx, weight * self.scale


class SparseMoeBlock(nn.Module):

    def __init__(self, c):
        super().__init__()
        self.experts = nn.ModuleList(MLP(c['hidden_size'], c['moe_intermediate_size']) for _ in range(c['num_experts']))
        self.gate = Gate(c)
        self.shared_experts = (MLP(c['hidden_size'], c['moe_intermediate_size'] * c['num_shared_experts'])
                               if c.get('num_shared_experts') else None)

    def forward(self, x):
        B, S, H = x.shape
        flat = x.reshape(-1, H)
        idx, weight = self.gate(flat)
        y = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if rows.numel():
                y = y.index_add(0, rows, expert(flat[rows]) * weight[rows, slot, None].to(flat.dtype))
        y = y.view(B, S, H)
        return y + self.shared_experts(x) if self.shared_experts is not None else y


class Attention(nn.Module):
    """Fused ``query_key_value`` ([all Q heads | all K heads | all V heads]), per-head QK-norm before RoPE on the first
    ``head_dim * partial_rotary_factor`` channels (rotate-half), causal softmax attention, ``dense`` out."""

    def __init__(self, c):
        super().__init__()
        self.heads, self.kv_heads = c['num_attention_heads'], c['num_key_value_heads']
        self.head_dim = c.get('head_dim') or c['hidden_size'] // self.heads
        self.query_key_value = nn.Linear(c['hidden_size'], (self.heads + 2 * self.kv_heads) * self.head_dim,
                                         bias=c.get('use_qkv_bias', False))
        self.use_qk_norm = c.get('use_qk_norm', False)
        if self.use_qk_norm:
            self.query_layernorm = RMSNorm(self.head_dim, c['rms_norm_eps'])
            self.key_layernorm = RMSNorm(self.head_dim, c['rms_norm_eps'])
        self.dense = nn.Linear(self.heads * self.head_dim, c['hidden_size'], bias=c.get('use_bias', False))

    def forward(self, x, cos, sin):
        B, S, _ = x.shape
        qkv = self.query_key_value(x).view(B, S, self.heads + 2 * self.kv_heads, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=-2))
        if self.use_qk_norm:
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        r = cos.shape[-1]
        q = torch.cat([q[..., :r] * cos + rotate_half(q[..., :r]) * sin, q[..., r:]], dim=-1)
        k = torch.cat([k[..., :r] * cos + rotate_half(k[..., :r]) * sin, k[..., r:]], dim=-1)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = q @ k.transpose(2, 3) / math.sqrt(self.head_dim)
        causal = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()
        probs = torch.softmax(scores.masked_fill(~causal, float('-inf')).float(), dim=-1).to(q.dtype)
        return self.dense((probs @ v).transpose(1, 2).reshape(B, S, -1))


class DecoderLayer(nn.Module):

    def __init__(self, c, layer_idx):
        super().__init__()
        self.attention = Attention(c)
        moe = c.get('num_experts') is not None and layer_idx >= c.get('first_k_dense_replace', 0)
        self.mlp = SparseMoeBlock(c) if moe else MLP(c['hidden_size'], c['intermediate_size'])
        self.input_layernorm = RMSNorm(c['hidden_size'], c['rms_norm_eps'])
        self.post_attention_layernorm = RMSNorm(c['hidden_size'], c['rms_norm_eps'])

    def forward(self, x, cos, sin):
        x = x + self.attention(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class _Output:
    """A transformers-style model output (``last_hidden_state``, ``logits``)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


class Model(nn.Module):

    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c['vocab_size'], c['hidden_size'])
        self.layers = nn.ModuleList(DecoderLayer(c, i) for i in range(c['num_hidden_layers']))
        self.norm = RMSNorm(c['hidden_size'], c['rms_norm_eps'])
        head_dim = c.get('head_dim') or c['hidden_size'] // c['num_attention_heads']
        dim = int(head_dim * c.get('partial_rotary_factor', 1.0))
        self.register_buffer('inv_freq', 1.0 / (c['rope_theta']**(torch.arange(0, dim, 2).float() / dim)),
                             persistent=False)

    def forward(self, inputs_embeds, position_ids, use_cache=False):
        freqs = position_ids[:, None, :, None].float() * self.inv_freq  # [B, 1, S, dim/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(inputs_embeds.dtype), emb.sin().to(inputs_embeds.dtype)
        x = inputs_embeds
        for layer in self.layers:
            x = layer(x, cos, sin)
        return _Output(last_hidden_state=self.norm(x))


class BailingMoeV2ForCausalLM(nn.Module):
    """The causal LM: ``model`` (word_embeddings, layers, norm) and ``lm_head``, with what the brute force
    (swift_plt.patch_level.reference) and tests/gpu/parity.py use of a transformers causal LM (``config`` with
    attribute access, ``forward(input_ids).logits``, ``from_pretrained`` / ``save_pretrained`` of one
    model.safetensors)."""

    def __init__(self, config: dict):
        super().__init__()
        if config.get('num_nextn_predict_layers'):
            raise ValueError('the hand-written Ling 2.0 has no MTP layers (num_nextn_predict_layers must be 0)')
        self.config = SimpleNamespace(**config)
        self.model = Model(config)
        self.lm_head = nn.Linear(config['hidden_size'], config['vocab_size'], bias=False)

    def get_input_embeddings(self):
        return self.model.word_embeddings

    def forward(self, input_ids, use_cache=False):
        P = input_ids.shape[1]
        pos = torch.arange(P, device=input_ids.device).expand_as(input_ids)
        hidden = self.model(self.model.word_embeddings(input_ids), pos).last_hidden_state
        return _Output(logits=self.lm_head(hidden))

    def init_weights(self):
        """transformers' init of such a model: every weight matrix N(0, initializer_range); norms 1, expert bias 0
        (as constructed)."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if not name.endswith('norm.weight'):
                    p.normal_(0.0, self.config.initializer_range)

    @classmethod
    def from_pretrained(cls, hf_dir, dtype=torch.float32):
        from safetensors.torch import load_file
        with open(os.path.join(hf_dir, 'config.json')) as f:
            model = cls(json.load(f))
        missing, unexpected = model.load_state_dict(load_file(os.path.join(hf_dir, 'model.safetensors')), strict=False)
        if missing or unexpected:
            raise KeyError(f'checkpoint does not match: missing {missing}, unexpected {unexpected}')
        return model.to(dtype)

    def save_pretrained(self, out_dir, safe_serialization=True):
        """model.safetensors in the published names, each tensor in its dtype (config.json: the caller's)."""
        from safetensors.torch import save_file
        assert safe_serialization, 'safetensors only'
        os.makedirs(out_dir, exist_ok=True)
        state = {n: t.contiguous() for n, t in self.state_dict().items()}
        save_file(state, os.path.join(out_dir, 'model.safetensors'), metadata={'format': 'pt'})


# Ling-mini-2.0's config.json keys (inclusionAI/Ling-mini-2.0) at toy widths: QK-norm, partial rotary (half the
# head), one dense first layer, sigmoid routing with expert bias over 2 groups of 4 experts (top-1 group, top-2
# experts: a group scored by its top-2 sum, as megatron's topk // topk_group = 2), renormalised and scaled by 2.5, a
# shared expert, no qkv / output bias, no MTP layer
TINY_CONFIG = dict(
    model_type=MODEL_TYPE, architectures=[ARCHITECTURE], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, partial_rotary_factor=0.5, rope_theta=600000.0,
    rope_scaling=None, use_qk_norm=True, use_qkv_bias=False, use_bias=False, hidden_act='silu', rms_norm_eps=1e-6,
    max_position_embeddings=512, num_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
    moe_intermediate_size=32, num_shared_experts=1, moe_shared_expert_intermediate_size=32, first_k_dense_replace=1,
    routed_scaling_factor=2.5, score_function='sigmoid', moe_router_enable_expert_bias=True, norm_topk_prob=True,
    router_dtype='fp32', num_nextn_predict_layers=0, tie_word_embeddings=False, initializer_range=0.05)


def make_tiny(family: str, out_dir: str, **kw) -> str:
    """The tiny random-init dir of any family: Ling 2.0's from this module, the others' from
    ``swift_plt.tools.tiny_families.make_tiny_family``."""
    if family == MODEL_TYPE:
        return make_tiny_bailing_moe(out_dir, **kw)
    from swift_plt.tools.tiny_families import make_tiny_family
    return make_tiny_family(family, out_dir, **kw)


def make_tiny_bailing_moe(out_dir: str, vocab_size: int = 512, seed: int = 0, **overrides) -> str:
    """Write a random-init fp32 Ling 2.0 checkpoint (config.json, model.safetensors in the published names, the
    offline BPE tokenizer of swift_plt.tools.tiny) to ``out_dir``; expert bias and norm weights random, not their
    init values, so a missed term shows."""
    from swift_plt.tools.tiny import _fork_rng, _train_tokenizer, make_tokenizer_config_portable
    config = dict(TINY_CONFIG, vocab_size=vocab_size, **overrides)
    os.makedirs(out_dir, exist_ok=True)
    tokenizer = _train_tokenizer(vocab_size, seed, config['max_position_embeddings'])
    tokenizer.save_pretrained(out_dir)
    make_tokenizer_config_portable(out_dir)
    config.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, torch_dtype='float32')
    with _fork_rng(seed):
        model = BailingMoeV2ForCausalLM(config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith('norm.weight'):
                    p.copy_(1.0 + 0.3 * torch.randn_like(p))
                else:
                    p.normal_(0.0, config['initializer_range'])
            for name, b in model.named_buffers():
                if name.endswith('expert_bias'):
                    b.copy_(0.1 * torch.randn_like(b))
    model.save_pretrained(out_dir)
    with open(os.path.join(out_dir, 'config.json'), 'w') as f:
        json.dump(config, f, indent=2)
    return out_dir
