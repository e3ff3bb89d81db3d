"""Critic training rows (swift_plt.critic.data format) for the CPU tests and the GPU script; nothing downloaded."""
import json
import random

WORDS = 'the red door opened slowly while seven apples fell from a basket of bread near the quiet field'.split()


def write_critic_jsonl(path, rows=64, kind='reward', seed=0, vocab=(20, 400)):
    """kind='reward': chat rows with a scalar reward that depends on the prompt's first word ("good" 1.5, "poor"
    0.5: learnable from the prompt, and returns vary, so explained variance is defined);
    kind='returns': token-id responses ({"token_ids": [...]}, "add_eos": false) with per-token returns
    (0.9^(n-1-i)) and old values (uniform +-0.2), for the clipped value loss."""
    rng = random.Random(seed)
    with open(path, 'w') as f:
        for _ in range(rows):
            good = rng.random() < 0.5
            prompt = ('good ' if good else 'poor ') + ' '.join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))
            if kind == 'reward':
                response = ' '.join(rng.choice(WORDS) for _ in range(rng.randint(2, 10)))
                row = {'reward': 1.5 if good else 0.5}
            elif kind == 'returns':
                n = rng.randint(2, 8)
                response = {'token_ids': [rng.randrange(*vocab) for _ in range(n)]}
                row = {'add_eos': False, 'returns': [round(0.9**(n - 1 - i), 4) for i in range(n)],
                       'old_values': [round(rng.uniform(-0.2, 0.2), 4) for _ in range(n)]}
            else:
                raise ValueError(kind)
            row['messages'] = [{'role': 'user', 'content': prompt}, {'role': 'assistant', 'content': response}]
            f.write(json.dumps(row) + '\n')
    return str(path)


if __name__ == '__main__':  # python tests/harness/critic_rows.py OUT.jsonl [reward|returns] [rows]
    import sys
    write_critic_jsonl(sys.argv[1], kind=sys.argv[2] if len(sys.argv) > 2 else 'reward',
                       rows=int(sys.argv[3]) if len(sys.argv) > 3 else 64)
