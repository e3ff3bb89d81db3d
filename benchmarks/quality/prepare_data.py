"""Data for the quality benchmark (CPU, run once before the GPU call; deterministic for a given corpus).

    python benchmarks/quality/prepare_data.py CORPUS_TXT_DIR KIT_DIR [--vocab 16384] [--heldout 0.02]

CORPUS_TXT_DIR holds .txt files of English text (the measured kit: 11 files, ~90 MB of public-domain books and
speeches and software documentation, see README.md). Writes into KIT_DIR (what the GPU run reads):
  tokenizer/            byte-level BPE, `--vocab` ids, trained on the TRAIN documents only (HF tokenizer files)
  train_docs.jsonl.xz   the train documents, one {"doc": id, "text": ...} a line, in a fixed shuffled order: every
                        run takes its data from the front of this stream (make_run_data.py)
  heldout_ids.npy       held-out token ids, [n, T] int32, each row BOS + T-1 tokens of one held-out document
  manifest.json         the split (held-out doc ids + sha1 of each), counts, tokenizer and seeds

Documents: each source file is cut at blank lines into paragraphs, and consecutive paragraphs are grouped into
documents of at least --doc_chars characters (the last group of a file may be shorter). A paragraph longer than
2 x --doc_chars is first cut at line ends (a line longer than --doc_chars at spaces) into pieces of at least
--doc_chars, so no document is longer than about 3 x --doc_chars (a file with no blank line, such as a KJV text,
would otherwise be one huge document that lands whole in one run's range). The split is by document: a seeded coin
with P(held-out) = --heldout per document.

A second corpus into the same kit (the continued-pretraining study, README.md):

    python benchmarks/quality/prepare_data.py CODE_DIR KIT_DIR --add_corpus B [--heldout_rows 512]
        [--max_rows_per_doc 8]

tokenizes the .txt files of CODE_DIR (make_code_corpus.py: one source file each) with KIT_DIR's tokenizer (no new
tokenizer: the same ids as corpus A) into KIT_DIR/corpora/B, a kit of its own that make_run_data.py and
eval_heldout.py read as they read KIT_DIR: tokenizer/ (a copy of KIT_DIR's, its sha256 in the manifest),
train_docs.jsonl.xz, heldout_ids.npy, manifest.json. Each file is one document, its text verbatim (blank lines and
indentation are code: no paragraph cutting). Held-out: whole files, never trained on, taken in a seeded order until
their rows reach --heldout_rows (at most --max_rows_per_doc rows of BOS + T-1 tokens from the start of each file, so
that no large file dominates); the rows are shuffled (seeded) and cut to --heldout_rows. The rest, shuffled (seeded),
is the train stream.
"""
import argparse
import hashlib
import json
import lzma
import os
import random
import re
import sys
import time

SPECIALS = ['<unk>', '<s>', '</s>', '<pad>']


def pieces(para, doc_chars):
    """A paragraph of at most 2 * doc_chars characters as is; a longer one cut at line ends (a line longer than
    doc_chars at spaces, the space becoming a line end) into pieces of doc_chars to 2 * doc_chars characters (the
    last may be shorter), in order: the words and their order are kept."""
    if len(para) <= 2 * doc_chars:
        return [para]
    lines = []
    for line in para.split('\n'):
        while len(line) > doc_chars:
            cut = line.rfind(' ', 1, doc_chars)
            cut = doc_chars if cut <= 0 else cut
            lines.append(line[:cut])
            line = line[cut:].lstrip(' ')
        lines.append(line)
    out, cur = [], []
    for line in lines:
        cur.append(line)
        if sum(len(x) + 1 for x in cur) - 1 >= doc_chars:
            out.append('\n'.join(cur))
            cur = []
    if cur:
        out.append('\n'.join(cur))
    return out


def documents(txt_dir, doc_chars):
    out = []
    for name in sorted(os.listdir(txt_dir)):
        if not name.endswith('.txt'):
            continue
        with open(os.path.join(txt_dir, name), encoding='utf-8', errors='replace') as f:
            text = f.read()
        paras = [q for p in re.split(r'\n\s*\n', text) if p.strip() for q in pieces(p.strip(), doc_chars)]
        cur, n, i = [], 0, 0
        for p in paras:
            cur.append(p)
            n += len(p)
            if n >= doc_chars:
                out.append((f'{name[:-4]}:{i}', '\n\n'.join(cur)))
                cur, n, i = [], 0, i + 1
        if cur:
            out.append((f'{name[:-4]}:{i}', '\n\n'.join(cur)))
    return out


def train_tokenizer(texts, vocab, out_dir, max_len):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE(unk_token='<unk>'))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    bos = tok.token_to_id('<s>')
    tok.post_processor = processors.TemplateProcessing(single='<s> $A', pair='<s> $A <s> $B',
                                                       special_tokens=[('<s>', bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token='<s>', eos_token='</s>', unk_token='<unk>',
                                   pad_token='<pad>', model_max_length=max_len)
    fast.save_pretrained(out_dir)
    from swift_plt.tools.tiny import make_tokenizer_config_portable
    make_tokenizer_config_portable(out_dir)  # loads under transformers 4.x and 5.x
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('corpus')
    ap.add_argument('kit')
    ap.add_argument('--vocab', type=int, default=16384)
    ap.add_argument('--heldout', type=float, default=0.02)
    ap.add_argument('--doc_chars', type=int, default=6000)
    ap.add_argument('--seq', type=int, default=512, help='T: held-out rows are BOS + T-1 tokens')
    ap.add_argument('--max_heldout_rows', type=int, default=512)
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--add_corpus', metavar='NAME', default=None,
                    help='a second corpus into the existing KIT (module docstring): KIT/corpora/NAME')
    ap.add_argument('--heldout_rows', type=int, default=512, help='--add_corpus: held-out rows wanted')
    ap.add_argument('--max_rows_per_doc', type=int, default=8, help='--add_corpus: held-out rows a file gives at most')
    a = ap.parse_args()
    if a.add_corpus:
        return add_corpus(a)
    import numpy as np
    os.makedirs(a.kit, exist_ok=True)
    t0 = time.time()
    docs = documents(a.corpus, a.doc_chars)
    coin = random.Random(a.seed)
    held = [d for d in docs if coin.random() < a.heldout]
    held_ids = {d[0] for d in held}
    train = [d for d in docs if d[0] not in held_ids]
    random.Random(a.seed + 1).shuffle(train)
    print(f'{len(docs)} documents: {len(train)} train, {len(held)} held-out ({time.time() - t0:.0f}s)', flush=True)
    tok = train_tokenizer((t for _, t in train), a.vocab, os.path.join(a.kit, 'tokenizer'), a.seq * 4)
    print(f'tokenizer: {tok.get_vocab_size()} ids ({time.time() - t0:.0f}s)', flush=True)
    enc = tok.encode_batch([t for _, t in train], add_special_tokens=False)
    train_tokens = [len(e.ids) for e in enc]
    with lzma.open(os.path.join(a.kit, 'train_docs.jsonl.xz'), 'wt', encoding='utf-8', preset=9) as f:
        for (i, t), n in zip(train, train_tokens):
            f.write(json.dumps({'doc': i, 'tokens': n, 'text': t}, ensure_ascii=False) + '\n')
    bos = tok.token_to_id('<s>')
    rows = []
    for _, t in held:
        ids = tok.encode(t, add_special_tokens=False).ids
        for s in range(0, len(ids) - (a.seq - 1) + 1, a.seq - 1):  # full rows only
            rows.append([bos] + ids[s:s + a.seq - 1])
    random.Random(a.seed + 2).shuffle(rows)
    rows = rows[:a.max_heldout_rows]
    np.save(os.path.join(a.kit, 'heldout_ids.npy'), np.asarray(rows, dtype=np.int32))
    by_source = {}
    for i, _ in train:
        by_source[i.split(':')[0]] = by_source.get(i.split(':')[0], 0) + 1
    manifest = {
        'corpus': sorted(n for n in os.listdir(a.corpus) if n.endswith('.txt')), 'doc_chars': a.doc_chars, 'seed': a.seed,
        'documents': len(docs), 'train_documents': len(train), 'heldout_documents': len(held),
        'train_tokens': sum(train_tokens), 'train_documents_by_source': by_source,
        'heldout_rows': len(rows), 'heldout_seq': a.seq, 'heldout_predicted_tokens': len(rows) * (a.seq - 1),
        'tokenizer': {'type': 'byte-level BPE (tokenizers)', 'vocab_size': tok.get_vocab_size(),
                      'trained_on': 'train documents only', 'specials': SPECIALS},
        'heldout': [{'doc': i, 'sha1': hashlib.sha1(t.encode()).hexdigest()[:12]} for i, t in held],
    }
    with open(os.path.join(a.kit, 'manifest.json'), 'w') as f:
        json.dump(manifest, f, indent=1)
    print(f'train tokens {sum(train_tokens):,}; held-out rows {len(rows)} x {a.seq} '
          f'({len(rows) * (a.seq - 1):,} predicted tokens); {time.time() - t0:.0f}s')


def whole_file_documents(txt_dir):
    """(id, text) per .txt file in name order, the text verbatim (no blank-line cutting: a code file's blank lines
    and indentation are its syntax); files that are blank are left out."""
    out = []
    for name in sorted(os.listdir(txt_dir)):
        if name.endswith('.txt'):
            with open(os.path.join(txt_dir, name), encoding='utf-8') as f:
                text = f.read()
            if text.strip():
                out.append((name[:-4], text))
    return out


def heldout_split(docs, ids_of, seq, want_rows, max_rows_per_doc, seed):
    """Whole documents held out in a seeded order until their rows reach ``want_rows``: (held, train, rows).
    ``ids_of(text)`` gives a document's token ids; each held-out document gives at most ``max_rows_per_doc`` rows of
    seq - 1 tokens from its start (the caller adds BOS); documents shorter than one row are never held out."""
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    held, rows = set(), []
    for i in order:
        if len(rows) >= want_rows:
            break
        ids = ids_of(docs[i][1])
        mine = [ids[s:s + seq - 1] for s in range(0, len(ids) - (seq - 1) + 1, seq - 1)][:max_rows_per_doc]
        if mine:
            held.add(i)
            rows += mine
    random.Random(seed + 2).shuffle(rows)
    return ([docs[i] for i in sorted(held)], [d for i, d in enumerate(docs) if i not in held], rows[:want_rows])


def sha256_file(path):
    with open(path, 'rb') as f:
        return hashlib.sha256(f.read()).hexdigest()


def add_corpus(a):
    """--add_corpus NAME: the .txt files of a.corpus, tokenized with a.kit's tokenizer, into a.kit/corpora/NAME."""
    import shutil

    import numpy as np
    from tokenizers import Tokenizer
    if not re.fullmatch(r'[A-Z][A-Za-z0-9]*', a.add_corpus) or a.add_corpus == 'A':
        raise SystemExit(f'--add_corpus {a.add_corpus!r}: a name like B (a capital letter first; A is the kit\'s own)')
    tok_dir = os.path.join(a.kit, 'tokenizer')
    if not os.path.exists(os.path.join(tok_dir, 'tokenizer.json')):
        raise SystemExit(f'{a.kit}: no tokenizer/tokenizer.json (run prepare_data.py on corpus A first)')
    t0 = time.time()
    out = os.path.join(a.kit, 'corpora', a.add_corpus)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    shutil.copytree(tok_dir, os.path.join(out, 'tokenizer'))
    tok = Tokenizer.from_file(os.path.join(tok_dir, 'tokenizer.json'))
    docs = whole_file_documents(a.corpus)
    cache = {}

    def ids_of(text):
        if text not in cache:
            cache[text] = tok.encode(text, add_special_tokens=False).ids
        return cache[text]

    held, train, rows = heldout_split(docs, ids_of, a.seq, a.heldout_rows, a.max_rows_per_doc, a.seed)
    random.Random(a.seed + 1).shuffle(train)
    enc = tok.encode_batch([t for _, t in train], add_special_tokens=False)
    train_tokens = [len(e.ids) for e in enc]
    with lzma.open(os.path.join(out, 'train_docs.jsonl.xz'), 'wt', encoding='utf-8', preset=9) as f:
        for (i, t), n in zip(train, train_tokens):
            f.write(json.dumps({'doc': i, 'tokens': n, 'text': t}, ensure_ascii=False) + '\n')
    bos = tok.token_to_id('<s>')
    np.save(os.path.join(out, 'heldout_ids.npy'), np.asarray([[bos] + r for r in rows], dtype=np.int32))
    source = None
    if os.path.exists(os.path.join(a.corpus, 'code_corpus.json')):
        with open(os.path.join(a.corpus, 'code_corpus.json')) as f:
            c = json.load(f)
        source = {'python': c.get('python'), 'roots': c.get('roots'), 'fingerprint': c.get('fingerprint')}
    manifest = {
        'name': a.add_corpus, 'corpus': os.path.abspath(a.corpus), 'source': source, 'seed': a.seed,
        'documents': len(docs), 'train_documents': len(train), 'heldout_documents': len(held),
        'train_tokens': sum(train_tokens), 'heldout_rows': len(rows), 'heldout_seq': a.seq,
        'heldout_predicted_tokens': len(rows) * (a.seq - 1), 'max_rows_per_doc': a.max_rows_per_doc,
        'tokenizer': {'copied_from': os.path.abspath(tok_dir),
                      'sha256': sha256_file(os.path.join(tok_dir, 'tokenizer.json')),
                      'vocab_size': tok.get_vocab_size()},
        'heldout': [{'doc': i, 'sha1': hashlib.sha1(t.encode()).hexdigest()[:12]} for i, t in held],
    }
    with open(os.path.join(out, 'manifest.json'), 'w') as f:
        json.dump(manifest, f, indent=1)
    print(f'corpus {a.add_corpus}: {len(docs)} documents: {len(train)} train ({sum(train_tokens):,} tokens), '
          f'{len(held)} held-out -> {len(rows)} rows x {a.seq}; {out} ({time.time() - t0:.0f}s)')
    if len(rows) < a.heldout_rows:
        print(f'warning: only {len(rows)} held-out rows (wanted {a.heldout_rows}): the corpus is small')
    return 0


if __name__ == '__main__':
    sys.exit(main())
