"""Generate a tiny random-init HF Llama (+ offline byte-level BPE tokenizer) and a pretraining jsonl, no download.

    python examples/make_tiny_llama.py OUT_DIR       # -> OUT_DIR/model, OUT_DIR/train.jsonl
Uses the generator of the test harness (tests/harness/tiny.py).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests'))
from harness.tiny import make_jsonl, make_tiny_llama  # noqa: E402

if __name__ == '__main__':
    out = sys.argv[1] if len(sys.argv) > 1 else 'tiny_llama'
    model = make_tiny_llama(os.path.join(out, 'model'), vocab_size=1024, hidden=128, layers=4, heads=4, kv_heads=2,
                            ffn=344, max_position_embeddings=1024)
    data = make_jsonl(os.path.join(out, 'train.jsonl'), rows=2000, max_sentences=12)
    print(f'model: {model}\ndata: {data}')
