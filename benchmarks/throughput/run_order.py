"""The launcher's run order (rounds of names, MBS 8 rounds, rotation) and its CPU sets."""


def cpu_split(cpus, lookahead):
    """(train cores, start cores) of the sorted core list: no split (both = all) below 8 cores or when serial."""
    cpus = sorted(cpus)
    if len(cpus) < 8 or lookahead <= 1:
        return cpus, cpus
    n_train = max(4, len(cpus) * 3 // 8)
    return cpus[:n_train], cpus[n_train:]


def fmt_cpus(cpus):
    """[0,1,2,5] -> '0-2,5'."""
    out, cpus = [], sorted(cpus)
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f'{cpus[i]}-{cpus[j]}')
        i = j + 1
    return ','.join(out)


def plan(names, rounds, rounds_m8, mbs, first_round=1, m8_after=None, rotate=False, warmup=False):
    """Interleaved run list [(key, base, round, mbs)]: the MBS `mbs` rounds, with the MBS 8 rounds after the first
    `m8_after` of them (default: after all), so that a budget cut drops the runs at the end of the list. A name
    `base@M` runs `base` at MBS M in the main rounds (each setting at its own micro-batch size, same GBS).
    rotate: round i (0-based, MBS 4 and MBS 8 counted apart) runs the names rotated left by i (A B C, B C A, C A B):
    over len(names) rounds each run takes each place in a round once, so a place effect (e.g. the run after a given
    one) does not fall on one run only. warmup: first an untimed-by-ratio run of names[0] at MBS `mbs`, round 0
    (the first run on a fresh machine was 9 % slower than the same run later: H200, 2026-11-23)."""
    m8_after = rounds if m8_after is None else min(m8_after, rounds)

    def order(i):
        j = i % len(names) if rotate else 0
        return names[j:] + names[:j]

    def run(n, r):  # 'plt4@16': base plt4 at MBS 16 (key plt4_mb16_rR); a plain name runs at `mbs`
        base, _, m = n.partition('@')
        return (f'{base}_mb{m}_r{r}', base, r, int(m)) if m else (f'{n}_r{r}', n, r, mbs)

    main = [[run(n, r) for n in order(i)] for i, r in enumerate(range(first_round, first_round + rounds))]
    m8 = [[(f'{n}_m8_r{r}', n, r, 8) for n in order(i)]
          for i, r in enumerate(range(first_round, first_round + rounds_m8))]
    head = [[run(names[0], 0)]] if warmup else []  # round 0: alone, in no ratio
    return [x for rnd in head + main[:m8_after] + m8 + main[m8_after:] for x in rnd]


def expand(spec):
    out = []
    for part in spec.split(','):
        lo, _, hi = part.partition('-')
        out += list(range(int(lo), int(hi or lo) + 1))
    return out
