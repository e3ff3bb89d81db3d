"""Tiny offline fixtures: a random-init HF Llama with a trained byte-level BPE tokenizer, and ms-swift jsonl data.
``swift-plt-make-tiny OUT_DIR`` (or ``python -m swift_plt.tools.tiny``) writes the quickstarts' OUT_DIR/model and
OUT_DIR/train.jsonl. Nothing is downloaded: a fixed word list, so a seed gives the same files on every machine.
"""
import argparse
import json
import os
import random
import sys
from typing import List, Optional

from swift_plt.compat.transformers import hf_rope_guard

_SUBJECTS = [
    'The old sailor', 'A young scientist', 'My neighbour', 'The small cat', 'Every student', 'The quiet engineer',
    'Our teacher', 'The tired farmer', 'A curious child', 'The city council', 'The river', 'The morning train',
    'A travelling musician', 'The library', 'Her brother', 'The committee', 'The north wind', 'A careful reader'
]
_VERBS = [
    'walked to', 'wrote about', 'looked at', 'carried', 'painted', 'measured', 'forgot', 'repaired', 'described',
    'followed', 'opened', 'counted', 'remembered', 'discovered', 'explained', 'visited', 'borrowed', 'watched'
]
_OBJECTS = [
    'the harbour', 'a long letter', 'the stars above the hills', 'an old wooden chair', 'the garden wall',
    'the distance between two towns', 'the name of the ship', 'a broken clock', 'the history of the valley',
    'the narrow bridge', 'the red door', 'seven apples', 'a map of the coast', 'the evening news', 'the last page',
    'a basket of bread', 'the quiet field', 'the winter market'
]
_ENDINGS = [
    'before the rain began.', 'after dinner.', 'with great care.', 'for the first time.', 'in the early morning.',
    'without saying a word.', 'while the bells were ringing.', 'because nobody else would.', 'on a cold Tuesday.',
    'and then went home.', 'as the sun went down.', 'in less than an hour.'
]
_PARAGRAPHS = [
    'It is a truth universally acknowledged that a small model trained on a small corpus will learn only a little.',
    'Numbers such as 3, 14, 159 and 2026 appear in text, and so do punctuation marks: commas, colons; dashes - and '
    'question marks?',
    'The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.',
    'Once upon a time there was a village by the sea, where the fishermen mended their nets every evening.',
]


def sentences(n: int = 400, seed: int = 0) -> List[str]:
    """``n`` deterministic English sentences."""
    rng = random.Random(seed)
    out = list(_PARAGRAPHS)
    while len(out) < n:
        out.append(f'{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_ENDINGS)}')
    return out[:n]


def make_tokenizer_config_portable(out_dir: str) -> None:
    """transformers 5 writes tokenizer_class "TokenizersBackend"; PreTrainedTokenizerFast loads under 4.x and 5.x."""
    tc_path = os.path.join(out_dir, 'tokenizer_config.json')
    with open(tc_path) as f:
        tc = json.load(f)
    tc['tokenizer_class'] = 'PreTrainedTokenizerFast'
    tc.pop('backend', None)
    with open(tc_path, 'w') as f:
        json.dump(tc, f, indent=2)


def _train_tokenizer(vocab_size: int, seed: int, model_max_length: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ['<unk>', '<s>', '</s>', '<pad>']
    tok = Tokenizer(models.BPE(unk_token='<unk>'))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False)
    tok.train_from_iterator(sentences(600, seed), trainer=trainer)
    bos = tok.token_to_id('<s>')
    tok.post_processor = processors.TemplateProcessing(
        single='<s> $A', pair='<s> $A <s> $B', special_tokens=[('<s>', bos)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token='<s>',
        eos_token='</s>',
        unk_token='<unk>',
        pad_token='<pad>',
        model_max_length=model_max_length)


def make_tiny_llama(out_dir: str,
                    *,
                    vocab_size: int = 512,
                    hidden: int = 64,
                    layers: int = 2,
                    heads: int = 4,
                    kv_heads: int = 2,
                    ffn: int = 128,
                    tie_word_embeddings: bool = False,
                    seed: int = 0,
                    max_position_embeddings: int = 512,
                    initializer_range: float = 0.05,  # > Llama's 0.02: logits far from zero, so comparisons tell
                    dtype: str = 'float32') -> str:
    """Write a random-init ``LlamaForCausalLM`` (``dtype`` safetensors; only bf16 round-trips HF -> mcore -> HF bit
    for bit) and its BPE tokenizer (``<unk> <s> </s> <pad>`` = ids 0..3) to ``out_dir``; return it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if vocab_size < 300:
        raise ValueError('vocab_size must be >= 300 (256 byte tokens + specials + merges).')
    os.makedirs(out_dir, exist_ok=True)
    tokenizer = _train_tokenizer(vocab_size, seed, max_position_embeddings)
    tokenizer.save_pretrained(out_dir)
    make_tokenizer_config_portable(out_dir)

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        initializer_range=initializer_range,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype=dtype)
    with _fork_rng(seed), hf_rope_guard():
        model = LlamaForCausalLM(config).float()
    import torch
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


class _fork_rng:
    """Seed torch for a block without disturbing the caller's RNG state."""

    def __init__(self, seed):
        self.seed = seed

    def __enter__(self):
        import torch
        self.state = torch.get_rng_state()
        torch.manual_seed(self.seed)

    def __exit__(self, *exc):
        import torch
        torch.set_rng_state(self.state)


def make_jsonl(path: str, rows: int = 64, seed: int = 0, max_sentences: int = 3) -> str:
    """Write ``rows`` ms-swift pretraining rows (one assistant message) of 1 to ``max_sentences`` sentences (~15-30
    tokens each), short ones more often: batches need padding and some rows exceed ``--max_length 64``."""
    rng = random.Random(seed)
    pool = sentences(600, seed + 1)
    counts = [n for n in range(1, max_sentences + 1) for _ in range(max_sentences + 1 - n)]  # 1 most frequent
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, 'w', encoding='utf-8') as f:
        for _ in range(rows):
            text = ' '.join(rng.choice(pool) for _ in range(rng.choice(counts)))
            f.write(json.dumps({'messages': [{'role': 'assistant', 'content': text}]}) + '\n')
    return path


def make_tiny_critic(out_dir: str, lm_dir: str, *, seed: int = 1, head_std: float = 0.5) -> str:
    """Write a critic in our HF format (the family's ``*ForTokenClassification``, ``num_labels=1``, a zero
    ``score.bias`` on 4.57.x): the causal LM ``lm_dir``'s trunk, a random ``score.weight`` [1, H] ~ N(0, head_std)."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForTokenClassification

    from swift_plt.critic.keys import critic_hf_config

    config = critic_hf_config(AutoConfig.from_pretrained(lm_dir))
    with _fork_rng(seed), hf_rope_guard():
        model = AutoModelForTokenClassification.from_pretrained(lm_dir, config=config, dtype=torch.float32)
        torch.nn.init.normal_(model.score.weight, std=head_std)
        if model.score.bias is not None:  # transformers 4.57.x: the format's zero bias
            torch.nn.init.zeros_(model.score.bias)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    for name in os.listdir(lm_dir):
        if name.startswith('tokenizer') or name == 'special_tokens_map.json':
            shutil.copy(os.path.join(lm_dir, name), os.path.join(out_dir, name))
    return out_dir


# The quickstarts' tiny model (examples/quickstart_cpu.sh, quickstart_gpu.sh, tests/gpu/two_stage.sh): ~1.4 M
# parameters, 1024-token vocabulary, 1024 positions; 2000 rows of 1 to 12 sentences.
QUICKSTART_MODEL = dict(vocab_size=1024, hidden=128, layers=4, heads=4, kv_heads=2, ffn=344,
                        max_position_embeddings=1024)
QUICKSTART_ROWS = dict(rows=2000, max_sentences=12)


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(
        prog='swift-plt-make-tiny',
        description='Write a tiny random-init HF Llama (+ offline byte-level BPE tokenizer) to OUT_DIR/model and '
        'a pretraining jsonl to OUT_DIR/train.jsonl; nothing is downloaded.')
    p.add_argument('out_dir', nargs='?', default='tiny_llama')
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    model = make_tiny_llama(os.path.join(args.out_dir, 'model'), **QUICKSTART_MODEL)
    data = make_jsonl(os.path.join(args.out_dir, 'train.jsonl'), **QUICKSTART_ROWS)
    print(f'model: {model}\ndata: {data}')


if __name__ == '__main__':
    main()
