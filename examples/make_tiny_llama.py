"""Generate a tiny random-init HF Llama (+ offline byte-level BPE tokenizer) and a pretraining jsonl, no download.

    python examples/make_tiny_llama.py OUT_DIR       # -> OUT_DIR/model, OUT_DIR/train.jsonl
The same as `swift-plt-make-tiny OUT_DIR` (the generator is swift_plt/tools/tiny.py, installed with swift-plt).
"""
from swift_plt.tools.tiny import main

if __name__ == '__main__':
    main()
