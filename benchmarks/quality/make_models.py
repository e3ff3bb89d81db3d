"""Random-init HF Llama models of the quality benchmark (tied embeddings, bf16 safetensors, fixed seed).

    python benchmarks/quality/make_models.py TOKENIZER_DIR OUT_DIR SIZE[@SEED] [...]     # SIZE in SIZES
SEED: the torch seed of the init (default 0, the models of every call before run seeds): OUT_DIR/SIZE, or
OUT_DIR/SIZE@SEED for another seed. Prints one JSON line per model: its dir and parameter counts.
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
MAX_POS = 2048


def make(tok_dir, out, size, seed=0):
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    hidden, layers, heads, kv, ffn = SIZES[size]
    tok = AutoTokenizer.from_pretrained(tok_dir)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=MAX_POS,
                      rms_norm_eps=1e-5, rope_theta=10000.0, initializer_range=0.02, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    for f in os.listdir(tok_dir):
        shutil.copy(os.path.join(tok_dir, f), out)
    total = sum(p.numel() for p in model.parameters())
    emb = model.model.embed_tokens.weight.numel()
    return {'size': size, 'dir': out, 'params': total, 'embedding_params': emb, 'non_embedding_params': total - emb,
            'hidden': hidden, 'layers': layers, 'heads': heads, 'kv_heads': kv, 'ffn': ffn, 'vocab': len(tok),
            'tied_embeddings': True, 'init_seed': seed}


if __name__ == '__main__':
    tok_dir, out = sys.argv[1], sys.argv[2]
    for spec in sys.argv[3:]:
        size, _, seed = spec.partition('@')
        m = make(tok_dir, os.path.join(out, spec), size, int(seed or 0))
        print(json.dumps(dict(m, key=spec)), flush=True)
