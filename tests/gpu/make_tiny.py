#!/usr/bin/env python3
"""The tiny Llama of the GPU checks and its pretraining rows, nothing downloaded (swift_plt.tools.tiny's generators).

    python3 tests/gpu/make_tiny.py --out DIR [--max-pos 2048]     # -> DIR/model (bf16), DIR/data/train.jsonl
    python3 tests/gpu/make_tiny.py --out DIR --critic CDIR        # also a critic (llama3_2_critic's HF format) in
                                                                  # CDIR: DIR/model's trunk + a head N(0, 0.05)

7.1 M parameters: hidden 256, 4 layers (PP=2 with VPP=2 gets one layer per virtual stage), 4 heads and 2 KV heads
(TP=2 splits both), vocab 8192 (the trained tokenizer uses fewer ids; the logits keep a realistic width), untied,
bf16 as Llama-3.2 ships. 2000 rows of 1 to 12 sentences.
"""
import argparse
import os

from swift_plt.tools.tiny import make_jsonl, make_tiny_critic, make_tiny_llama


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--out', required=True)
    ap.add_argument('--max-pos', type=int, default=2048)
    ap.add_argument('--rows', type=int, default=2000)
    ap.add_argument('--critic', default=None, help='also write a tiny critic here')
    ap.add_argument('--head-std', type=float, default=0.05, help="std of the critic's random value head")
    a = ap.parse_args()
    model = make_tiny_llama(os.path.join(a.out, 'model'), vocab_size=8192, hidden=256, layers=4, heads=4, kv_heads=2,
                            ffn=688, max_position_embeddings=a.max_pos, dtype='bfloat16')
    data = make_jsonl(os.path.join(a.out, 'data', 'train.jsonl'), rows=a.rows, max_sentences=12)
    from safetensors import safe_open
    with safe_open(os.path.join(model, 'model.safetensors'), 'pt') as f:
        n = sum(_prod(f.get_slice(k).get_shape()) for k in f.keys())
    print(f'model: {n / 1e6:.2f} M params -> {model}')
    print(f'data: {a.rows} rows -> {data}')
    if a.critic:
        print(f'critic: {make_tiny_critic(a.critic, model, head_std=a.head_std)}')


def _prod(shape):
    out = 1
    for s in shape:
        out *= s
    return out


if __name__ == '__main__':
    main()
