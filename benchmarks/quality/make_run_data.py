"""Per-run training files for the quality benchmark, cut from the fixed train-document stream.

    python benchmarks/quality/make_run_data.py KIT_DIR OUT_DIR --spec NAME:START:TOKENS:LENGTH ... [--reserve_from R]

For each spec, the tokens [START, START+TOKENS) of the stream (train_docs.jsonl.xz, in its fixed order; positions
counted in the benchmark tokenizer's tokens; a document across a boundary is split there) are concatenated,
documents joined by a blank line, and cut into pieces of LENGTH-8 tokens (each piece is the text between token
offsets; re-encoding a piece alone can merge differently at its ends, by a token or two: the 8 tokens of slack
hold BOS, EOS and that). So every row is full at any length: with whole documents as rows, packing filled the
K*T = 2048-token rows of stage 1 only to 86% on average (documents of ~1.5-2k tokens do not pair up), the T-token
rows to 98.7% (seen on the GPU). and written as ms-swift pretraining rows OUT_DIR/NAME.jsonl ({"messages": [{"role": "assistant", ...}]}).
A 4% margin of documents from the reserve (the stream from token R on, which no run trains on otherwise) is added so
that packing losses never make a run wrap around into a second epoch; specs of one run take consecutive reserve
slices (--reserve_group). Prints and writes OUT_DIR/data_stats.json (rows and tokens per file).
"""
import argparse
import json
import lzma
import os


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('kit')
    ap.add_argument('out')
    ap.add_argument('--spec', nargs='+', required=True, help='NAME:START:TOKENS:LENGTH[:RESERVE_OFFSET]')
    ap.add_argument('--reserve_from', type=int, required=True)
    ap.add_argument('--margin', type=float, default=0.04)
    ap.add_argument('--stats', default='data_stats.json', help='file name (in OUT_DIR) of the row/token counts')
    a = ap.parse_args()
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(a.kit, 'tokenizer', 'tokenizer.json'))
    docs, pos, n_tokens = [], 0, {}
    with lzma.open(os.path.join(a.kit, 'train_docs.jsonl.xz'), 'rt', encoding='utf-8') as f:
        for line in f:
            d = json.loads(line)
            docs.append((pos, d['text']))
            n_tokens[pos] = d['tokens']
            pos += d['tokens']
    os.makedirs(a.out, exist_ok=True)
    stats = {}
    for spec in a.spec:
        fields = spec.split(':')
        name, start, tokens, length = fields[0], int(fields[1]), int(fields[2]), int(fields[3])
        roff = int(fields[4]) if len(fields) > 4 else 0
        r0 = a.reserve_from + roff
        margin = int(tokens * a.margin)
        if max(start + tokens, r0 + margin) > pos:
            raise SystemExit(f'{spec}: needs tokens up to {max(start + tokens, r0 + margin):,} of a stream of {pos:,}')
        # the documents overlapping [lo, hi), each cut to its tokens inside the range (a document across a
        # boundary is split there)
        parts = [(p, t, lo, hi) for lo, hi in ((start, start + tokens), (r0, r0 + margin)) for p, t in docs
                 if p < hi and p + n_tokens[p] > lo]
        chunk = length - 8
        rows = ntok = 0
        with open(os.path.join(a.out, name + '.jsonl'), 'w', encoding='utf-8') as f:
            # one stream: the documents' token spans in order, joined by a blank line (counted as one token), cut
            # into pieces of `chunk` tokens (the text between a piece's first and last token offsets). Every row
            # is then full (packing has nothing to fill) at K=1 and at K*T alike.
            segs, need = [], chunk

            def flush():
                nonlocal segs, need, rows, ntok
                piece = '\n\n'.join(segs)
                if piece.strip():
                    f.write(json.dumps({'messages': [{'role': 'assistant', 'content': piece}]}, ensure_ascii=False)
                            + '\n')
                    rows += 1
                    ntok += chunk - need
                segs, need = [], chunk

            for (p, text, lo, hi), enc in zip(parts, tok.encode_batch([t for _, t, _, _ in parts],
                                                                      add_special_tokens=False)):
                offs = enc.offsets
                s_, i1 = max(lo - p, 0), min(hi - p, len(offs))
                while s_ < i1:
                    e = min(s_ + need, i1)
                    segs.append(text[offs[s_][0]:offs[e - 1][1]])
                    need -= e - s_
                    s_ = e
                    if need <= 1:  # full (a blank line would cost the last token)
                        flush()
                    else:
                        need -= 1  # the separator before the next document's text
            if segs:
                flush()
        stats[name] = {'start': start, 'tokens_budget': tokens, 'length': length, 'reserve': [r0, r0 + margin],
                       'documents': len(parts), 'rows': rows, 'tokens': ntok}
        print(f'{name}: stream [{start:,}, {start + tokens:,}) + reserve [{r0:,}, {r0 + margin:,}): {len(parts)} docs '
              f'-> {rows} rows of <= {length - 4} tokens, {ntok:,} tokens', flush=True)
    with open(os.path.join(a.out, a.stats), 'w') as f:
        json.dump(stats, f, indent=1)


if __name__ == '__main__':
    main()
