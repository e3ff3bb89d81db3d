"""Random-init HF models of the quality benchmark (tied embeddings, bf16 safetensors, fixed seed): Llama (SIZES)
and two other structures at the tiny Llama's non-embedding compute per token (FAMILY_SIZES).

    python benchmarks/quality/make_models.py TOKENIZER_DIR OUT_DIR SIZE[@SEED] [...]     # SIZE in SIZES, FAMILY_SIZES
SEED: the torch seed of the init (default 0, the models of every call before run seeds): OUT_DIR/SIZE, or
OUT_DIR/SIZE@SEED for another seed. Prints one JSON line per model: its dir, parameter counts (MoE: also the active
ones, top-k of the experts) and what report.py's FLOPs count needs (attention layers and width, Gated-DeltaNet state).
"""
import json
import os
import shutil
import sys

# name: hidden, layers, heads, kv_heads, ffn
SIZES = {
    'tiny': (64, 2, 4, 2, 128),  # CPU dry run only
    'XS': (128, 4, 4, 2, 344),
    'S': (256, 4, 4, 2, 688),
    'M': (512, 8, 8, 4, 1376),
}
# other structures (README.md, "MoE and hybrid"): name (no '_': jobs.py) -> (HF model_type = --model_type, config
# fields); non-embedding parameters per token (MoE: the active ones) within 2.5 % of tiny's 74,048
FAMILY_SIZES = {
    # Qwen3-MoE: tiny's shape (QK-norm added), every layer 8 experts of FFN 64 and top-2 (2 x 64 = tiny's FFN 128):
    # 75,136 active of 222,592 non-embedding parameters (intermediate_size: no dense layer uses it)
    'tinyMoE': ('qwen3_moe', dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                                  moe_intermediate_size=64, decoder_sparse_step=1, norm_topk_prob=True)),
    # Qwen3.5 (a multimodal checkpoint; its vision tower, 34,400 parameters, never sees text): 3 Gated DeltaNet layers
    # (2 key heads, 4 value heads of 16), then 1 gated-attention layer (2 heads of 32, 1 KV head), FFN 3H: Qwen3-Next's
    # proportions (linear keys H, values 2H, attention 2H) at H = 32: 72,360 parameters
    'tinyHybrid': ('qwen3_5', dict(hidden_size=32, intermediate_size=96, num_hidden_layers=4, full_attention_interval=4,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                   partial_rotary_factor=0.25, linear_conv_kernel_dim=4, linear_key_head_dim=16,
                                   linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4)),
}
TINY_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, num_position_embeddings=64)
# ms-swift loads a Qwen3.5 checkpoint's processor (Qwen3VLProcessor): its files as the hub checkpoints ship them
PROCESSOR = {'size': {'longest_edge': 16777216, 'shortest_edge': 65536}, 'patch_size': 16, 'temporal_patch_size': 2,
             'merge_size': 2, 'image_mean': [0.5] * 3, 'image_std': [0.5] * 3, 'processor_class': 'Qwen3VLProcessor'}
MAX_POS = 2048
KIT_TOKENIZER = 'tokenization_kit.py'  # a qwen3_5 model dir's tokenizer class (keep_kit_tokenizer)
SAMPLE = 'def f(x):\n    return x  # ünïcode, 3.14 and  two  spaces\n\nThe end. '


def model_type(size):
    """The --model_type of a size's token-level runs (the recipe reads config.json's)."""
    return FAMILY_SIZES[size][0] if size in FAMILY_SIZES else 'llama'


def structure(size):
    """'dense', 'moe' or 'hybrid' (Gated DeltaNet + attention)."""
    return {'qwen3_moe': 'moe', 'qwen3_5': 'hybrid'}.get(model_type(size), 'dense')


def make(tok_dir, out, size, seed=0):
    """The model of a size in ``out``; SystemExit when its tokenizer, loaded as ms-swift loads it, gives other ids
    than the kit's (the run would train on other ids than the held-out set scores)."""
    rec = _make(tok_dir, out, size, seed)
    for f in os.listdir(tok_dir):
        shutil.copy(os.path.join(tok_dir, f), out)
    if model_type(size) == 'qwen3_5':
        keep_kit_tokenizer(out)
    problem = tokenizer_problem(out, tok_dir)
    if problem:
        raise SystemExit(problem)
    return rec


def keep_kit_tokenizer(out):
    """transformers 5.19 (not 5.17) loads a qwen3_5 checkpoint's tokenizer as Qwen3_5Tokenizer whatever class it
    names, and that class rebuilds Qwen's pre-tokenizer: other ids than the kit's. An auto_map to a plain fast
    tokenizer (ms-swift loads with trust_remote_code) keeps the kit's tokenizer.json as it is."""
    with open(os.path.join(out, 'tokenizer_config.json')) as f:
        cfg = json.load(f)
    cfg['auto_map'] = {'AutoTokenizer': [None, 'tokenization_kit.KitTokenizer']}
    with open(os.path.join(out, 'tokenizer_config.json'), 'w') as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out, KIT_TOKENIZER), 'w') as f:
        f.write('from transformers import PreTrainedTokenizerFast\n\n\nclass KitTokenizer(PreTrainedTokenizerFast):\n'
                '    """The kit\'s tokenizer.json as it is."""\n')


def keep_tokenizer_class(model_dir, hf_dir):
    """An exported ``hf_dir`` of a model made with keep_kit_tokenizer gets it too: the export saves the auto_map (slots
    swapped) but not tokenization_kit.py, so a trust_remote_code load of it (ms-swift's, a continuation's) fails."""
    if os.path.exists(os.path.join(model_dir, KIT_TOKENIZER)) and os.path.isdir(hf_dir):
        keep_kit_tokenizer(hf_dir)


def tokenizer_problem(model_dir, tok_dir):
    """None when ``model_dir``'s tokenizer (AutoTokenizer, trust_remote_code, as ms-swift loads it) encodes a sample
    and the kit's first ids decoded as the kit tokenizer does; else what differs."""
    import transformers
    kit = transformers.AutoTokenizer.from_pretrained(tok_dir)
    got = transformers.AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)
    text = SAMPLE + kit.decode(list(range(min(len(kit), 260))), skip_special_tokens=True)
    want, have = kit(text, add_special_tokens=False)['input_ids'], got(text, add_special_tokens=False)['input_ids']
    if want == have:
        return None
    return (f'{model_dir}: transformers {transformers.__version__} loads its tokenizer as {type(got).__name__}, which '
            f'encodes a sample to {len(have)} ids (first {have[:6]}) against the kit tokenizer\'s {len(want)} '
            f'({want[:6]}): the model would train on other ids than the held-out set scores')


def _make(tok_dir, out, size, seed):
    """The random-init model of a size, saved in ``out`` (make() adds the tokenizer); its parameter record."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    tok = AutoTokenizer.from_pretrained(tok_dir)
    if size in FAMILY_SIZES:
        return make_family(tok, out, size, seed)
    hidden, layers, heads, kv, ffn = SIZES[size]
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=MAX_POS,
                      rms_norm_eps=1e-5, rope_theta=10000.0, initializer_range=0.02, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    total = sum(p.numel() for p in model.parameters())
    emb = model.model.embed_tokens.weight.numel()
    return {'size': size, 'dir': out, 'params': total, 'embedding_params': emb, 'non_embedding_params': total - emb,
            'hidden': hidden, 'layers': layers, 'heads': heads, 'kv_heads': kv, 'ffn': ffn, 'vocab': len(tok),
            'tied_embeddings': True, 'init_seed': seed, 'model_type': 'llama', 'structure': 'dense'}


def make_family(tok, out, size, seed):
    """A FAMILY_SIZES model: Qwen3-MoE (Qwen3MoeForCausalLM) or Qwen3.5 (Qwen3_5ForConditionalGeneration: text config
    + TINY_VISION, media ids the last 4 of the vocabulary (text rows never mark them as media), full_attention_interval
    in config.json for mcore-bridge, the processor's files)."""
    import torch
    import transformers
    mtype, fields = FAMILY_SIZES[size]
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    text = dict(fields, vocab_size=len(tok), max_position_embeddings=MAX_POS, rms_norm_eps=1e-5,
                initializer_range=0.02, tie_word_embeddings=True, **ids)
    V, H = len(tok), fields['hidden_size']
    if mtype == 'qwen3_5':
        cfg = transformers.Qwen3_5Config(text_config=text, vision_config=dict(TINY_VISION, out_hidden_size=H),
                                         image_token_id=V - 4, video_token_id=V - 3, vision_start_token_id=V - 2,
                                         vision_end_token_id=V - 1, tie_word_embeddings=True, **ids)
        cls = transformers.Qwen3_5ForConditionalGeneration
    else:
        cfg, cls = transformers.Qwen3MoeConfig(**text), transformers.Qwen3MoeForCausalLM
    torch.manual_seed(seed)
    model = cls(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    if mtype == 'qwen3_5':  # transformers 5 writes layer_types only; mcore-bridge reads full_attention_interval
        with open(os.path.join(out, 'config.json')) as f:
            c = json.load(f)
        c['text_config']['full_attention_interval'] = fields['full_attention_interval']
        image = dict(PROCESSOR, image_processor_type='Qwen2VLImageProcessorFast')
        video = dict(PROCESSOR, video_processor_type='Qwen3VLVideoProcessor', fps=2, min_frames=4, max_frames=768,
                     size={'longest_edge': 25165824, 'shortest_edge': 4096}, do_sample_frames=True)
        for name, d in (('config.json', c), ('preprocessor_config.json', image),
                        ('video_preprocessor_config.json', video)):
            with open(os.path.join(out, name), 'w') as f:
                json.dump(d, f, indent=2)
    named = dict(model.named_parameters())
    vision = sum(p.numel() for n, p in named.items() if '.visual.' in n or n.startswith('visual.'))
    emb = next(p.numel() for n, p in named.items() if n.endswith('embed_tokens.weight'))
    total = sum(p.numel() for p in named.values()) - vision
    experts = sum(p.numel() for n, p in named.items() if '.experts.' in n)
    E, k = fields.get('num_experts', 1), fields.get('num_experts_per_tok', 1)
    layers = fields['num_hidden_layers']
    attn = layers // fields.get('full_attention_interval', 1)  # the rest: Gated DeltaNet
    gdn = fields.get('linear_num_value_heads', 0) * fields.get('linear_key_head_dim', 0) * \
        fields.get('linear_value_head_dim', 0)
    return {'size': size, 'dir': out, 'params': total, 'embedding_params': emb, 'non_embedding_params': total - emb,
            'active_non_embedding_params': total - emb - experts + experts * k // E, 'vision_params': vision,
            'hidden': H, 'layers': layers, 'heads': fields['num_attention_heads'],
            'kv_heads': fields['num_key_value_heads'], 'head_dim': fields['head_dim'],
            'ffn': None if E > 1 else fields['intermediate_size'], 'experts': E if E > 1 else None,
            'top_k': k if E > 1 else None, 'expert_ffn': fields.get('moe_intermediate_size'),
            'attention_layers': attn, 'attention_width': fields['num_attention_heads'] * fields['head_dim'],
            'gdn_layers': layers - attn, 'gdn_state': gdn, 'vocab': V, 'tied_embeddings': True, 'init_seed': seed,
            'model_type': mtype, 'structure': structure(size)}


if __name__ == '__main__':
    tok_dir, out = sys.argv[1], sys.argv[2]
    for spec in sys.argv[3:]:
        size, _, seed = spec.partition('@')
        m = make(tok_dir, os.path.join(out, spec), size, int(seed or 0))
        print(json.dumps(dict(m, key=spec)), flush=True)
