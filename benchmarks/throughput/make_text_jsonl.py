#!/usr/bin/env python3
"""English text -> ms-swift pretraining rows for throughput_1b.sh.

    python3 benchmarks/throughput/make_text_jsonl.py TEXT OUT.jsonl [--chars 4000] [--repeat 1]

Paragraphs (blank-line separated) are grouped into documents of about --chars characters (~1000 Llama-3 tokens at
4000), one row {"messages": [{"role": "assistant", "content": DOC}]} each; --repeat writes the list that many times.
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('text')
    ap.add_argument('out')
    ap.add_argument('--chars', type=int, default=4000)
    ap.add_argument('--repeat', type=int, default=1)
    a = ap.parse_args()
    paras = [p.strip() for p in open(a.text, encoding='utf-8').read().split('\n\n') if p.strip()]
    docs, cur = [], []
    for p in paras:
        cur.append(p)
        if sum(len(c) for c in cur) >= a.chars:
            docs.append('\n\n'.join(cur))
            cur = []
    if cur:
        docs.append('\n\n'.join(cur))
    with open(a.out, 'w', encoding='utf-8') as f:
        for _ in range(a.repeat):
            for d in docs:
                f.write(json.dumps({'messages': [{'role': 'assistant', 'content': d}]}) + '\n')
    print(f'{len(docs)} documents x {a.repeat} -> {a.out} ({sum(map(len, docs)) * a.repeat / 1e6:.1f} M chars)')


if __name__ == '__main__':
    main()
