"""The run list of one quality call: its jobs (size, run, N, seed), their data files and a cost estimate (run.py).

A job is one training pipeline, identified by (size, run, N, seed):
    size   a make_models.SIZES or FAMILY_SIZES name (no '_')
    run    a variants.py name: a, b, c, b_k2, c_l34, ...
    N      the run's N as in variants.py: (a) trains on N tokens, (b) on N (two stages), (c) on 2N
    seed   megatron's --seed and --data_seed (the order of the rows) and the random init of the model
           (make_models' torch seed: 0 for seed 42, the init of every call before seeds existed; else the seed)
Its id, SIZE_RUN_nN_sSEED (e.g. XS_b_n10000000_s42), names its output dir (WORK/runs/ID) and its eval record.

The run list of a call is the cross product of --sizes, --runs, --tokens and --seeds, with this seed rule:
    every run takes every seed, except (a): token-level on N takes only the first seed, unless it is the (a½) of a
    two-stage (b) run of the call (2N is in --tokens and a b-family run is in --runs), or --all_seeds.
    `ah` names (a½) itself: token-level on N/2, every seed (the same job as (a) at N/2: one run serves both).
    (c) on N is the job (b) on 2N where the call has that one too (regime.py counts it so): it runs once, as (b).
plus the explicit --jobs SIZE:RUN:N:SEED; duplicates run once. (a½) of (b) at N is token-level on the stream's
first N/2 tokens, the data prefix (b) trains on, at about the same compute as (b).

Continued pretraining (README.md, "Continued pretraining"): a job may train on another corpus of the kit (corpus,
e.g. 'B': KIT/corpora/B, prepare_data.py --add_corpus) starting from the exported HF model of a token-level run on
corpus A (from_n: that run's N; its size and seed are the job's): the start job Job(size, 'a', from_n, seed). Its
id gets _CORPUS_fromN_A: XS_b_n2000000_s42_B_from20000000 is (b) on 2 M tokens of B, seed 42, from the XS (a) model
of 20 M tokens of A at seed 42 (XS_a_n20000000_s42). A continuation starts only once its start job has finished
(run.py), its data are cuts of corpus B's own stream (file names B_...), with B's own reserve; the continuation
run list (expand(..., from_n=N_A)) takes every run at every seed, each seed from the start model of that seed.
"""
import re
from collections import namedtuple

from variants import parse_run

Job = namedtuple('Job', 'size run N seed corpus from_n', defaults=('A', None))
MARGIN = 0.04  # make_run_data.py --margin
FIRST_SEED = 42  # the seed of every call before --seeds; its init is make_models' seed 0
_ID = re.compile(r'^(?P<size>[A-Za-z0-9]+)_(?P<run>[a-z0-9_]+)_n(?P<N>[0-9]+)_s(?P<seed>[0-9]+)'
                 r'(?:_(?P<corpus>[A-Z][A-Za-z0-9]*)(?:_from(?P<from_n>[0-9]+))?)?$')
_CORPUS = re.compile(r'^[A-Z][A-Za-z0-9]*$')

# Cost model (H100, T=512, G=32; benchmarks/quality/README.md calls of 2026-11-25, each loop alone on the GPU):
STARTUP_S = 95  # one `megatron pt` launch without its steps: M (a) 178 s wall - 80 s of steps, XS 144 - 57
EXPORT_S = 40  # one swift-plt-export-vanilla (measured 36-46 s)
# seconds per optimizer step: (token level at T, patch level at K*T); XS: (a) 0.093-0.136, stage 2 0.114-0.13,
# stage 1 0.067-0.088; M: (a) 0.131-0.183, stage 2 0.116-0.166, stage 1 0.077-0.109. tiny and S: not measured
# (tiny as XS: these sizes are host-bound; S between XS and M). 8 at once on an H200 (2026-11-29): tinyMoE (a)
# 0.09-0.15, stage 1 0.08-0.11; tinyHybrid (megatron-core's torch Gated DeltaNet, run.py --gdn torch) (a) 0.26-0.43,
# stage 2 0.25-0.28, stage 1 0.27-0.42.
STEP_S = {'tiny': (0.12, 0.08), 'XS': (0.12, 0.08), 'S': (0.135, 0.09), 'M': (0.15, 0.10),
          'tinyMoE': (0.15, 0.10), 'tinyHybrid': (0.40, 0.40)}


def job_id(job):
    tail = '' if job.corpus == 'A' else f'_{job.corpus}'
    if job.from_n:
        tail += f'_from{job.from_n}'
    return f'{job.size}_{job.run}_n{job.N}_s{job.seed}{tail}'


def check_job(job):
    """ValueError unless the corpus is a name like B and a start (from_n) goes with a corpus other than A."""
    if not _CORPUS.match(job.corpus):
        raise ValueError(f'{job}: corpus {job.corpus!r} is not a name like A or B')
    if job.from_n is not None and (job.corpus == 'A' or job.from_n <= 0):
        raise ValueError(f'{job}: a continuation (from_n) trains on another corpus than A, from a positive N_A')
    return job


def start_job(job):
    """The token-level run on corpus A whose exported model a continuation starts from; None for a random init."""
    return None if job.from_n is None else Job(job.size, 'a', job.from_n, job.seed)


def parse_job_id(text):
    """'XS_b_k2_n10000000_s43' -> Job('XS', 'b_k2', 10000000, 43); 'XS_a_n2_s42_B_from20' -> a continuation;
    ValueError for anything else."""
    m = _ID.match(text)
    if not m:
        raise ValueError(f'job id {text!r}: expected SIZE_RUN_nN_sSEED[_CORPUS[_fromN]] (e.g. XS_b_n10000000_s42)')
    parse_run(m['run'])
    return check_job(Job(m['size'], m['run'], int(m['N']), int(m['seed']), m['corpus'] or 'A',
                         int(m['from_n']) if m['from_n'] else None))


def parse_job_spec(text, parse_tokens=int):
    """--jobs item 'tiny:b_k2:20M:42' -> Job('tiny', 'b_k2', 20000000, 42) (N through ``parse_tokens``);
    'XS:b:2M:42:B:20M' -> (b) on 2 M tokens of corpus B from the (a) model of 20 M tokens of A (seed 42)."""
    parts = text.split(':')
    if len(parts) not in (4, 6):
        raise ValueError(f'--jobs {text!r}: expected SIZE:RUN:N:SEED (e.g. tiny:b_k2:20000000:42) or '
                         'SIZE:RUN:N:SEED:CORPUS:N_A (e.g. XS:b:2M:42:B:20M)')
    size, run, n, seed = parts[:4]
    if run == 'ah':
        raise ValueError(f'--jobs {text!r}: name (a½) as a at N/2')
    parse_run(run)
    if not size or '_' in size:
        raise ValueError(f'--jobs {text!r}: bad size {size!r}')
    if len(parts) == 6:
        return check_job(Job(size, run, parse_tokens(n), int(seed), parts[4], parse_tokens(parts[5])))
    return Job(size, run, parse_tokens(n), int(seed))


def expand(sizes, runs, tokens, seeds, all_seeds=False, extra=(), corpus=None, from_n=None):
    """The jobs of a call, in order, each once (the seed rule: module docstring). With ``from_n`` (continued
    pretraining), the runs of the cross product train on ``corpus`` (default B) from the (a) model on ``from_n``
    tokens of A of their size and seed, every run at every seed; the start jobs come first (with_starts)."""
    corpus = corpus or ('B' if from_n is not None else 'A')
    for run in runs:
        if run != 'ah':
            parse_run(run)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f'--seeds {seeds}: give one or more distinct seeds')
    b_family = any(parse_run(r)[0] == 'b' for r in runs if r != 'ah')
    if from_n is not None:
        all_seeds = True  # each seed has its own start model: every run is compared at every seed
    out = []

    def add(job):
        if job not in out:
            out.append(job)

    def job(size, run, n, s):
        return check_job(Job(size, run, n, s, corpus, from_n)) if from_n is not None else Job(size, run, n, s)

    for size in sizes:
        for run in runs:
            for n in tokens:
                if run == 'ah':
                    for s in seeds:
                        add(job(size, 'a', n // 2, s))
                elif run == 'a':
                    every = all_seeds or (b_family and 2 * n in tokens)
                    for s in (seeds if every else seeds[:1]):
                        add(job(size, 'a', n, s))
                else:
                    for s in seeds:
                        add(job(size, run, n, s))
    for x in extra:
        add(x)
    # (c) on N trains what (b) on 2N trains (the same cuts and steps: job_plan): one job, the (b)
    out = [j for j in out if not (j.run[0] == 'c' and j._replace(run='b' + j.run[1:], N=2 * j.N) in out)]
    return with_starts(out)


def with_starts(jobs):
    """``jobs`` with the start job of every continuation added (once, before the first job that needs it)."""
    out = []
    for job in jobs:
        start = start_job(job)
        if start is not None and start not in out:
            out.append(start)
        if job not in out:
            out.append(job)
    return out


def init_seed(seed):
    """make_models' torch seed for a run seed: 0 for 42 (the models of the calls before --seeds), else the seed."""
    return 0 if seed == FIRST_SEED else seed


def model_key(size, seed):
    """make_models.py argument and models/ dir name of a job's random-init model."""
    s = init_seed(seed)
    return size if s == 0 else f'{size}@{s}'


def job_plan(job, T, G, stage1_batch, make_plan):
    """(plan or None, files): files maps 'a' or '1', '2' to the (start, tokens, length, reserve offset) of the
    stream cut it trains on (make_run_data.py spec fields): (a) [0, N) at T; (b)/(c) stage 1 [0, n1) at K*T, stage 2
    [n1, n) at T with n = N (b) or 2N (c) and n1 the plan's stage-1 tokens. The margin from the reserve: 4 % of a
    file's tokens, the stage-2 slice after stage 1's."""
    base, K, lam = parse_run(job.run)
    tag = () if job.corpus == 'A' else (job.corpus,)  # a cut of another corpus's stream: (..., corpus)
    if base == 'a':
        if job.N // (G * T) < 1:
            raise ValueError(f'{job_id(job)}: N = {job.N} is less than one step of {G * T} tokens')
        return None, {'a': (0, job.N, T, 0) + tag}
    n = job.N if base == 'b' else 2 * job.N
    plan = make_plan(n, K, lam, seq_length=T, global_batch_size=G, stage1_batch=stage1_batch)
    n1 = plan.stage1.budget_tokens
    return plan, {'1': (0, n1, K * T, 0) + tag, '2': (n1, n - n1, T, int(n1 * MARGIN)) + tag}


def cut_corpus(cut):
    """The corpus whose stream a cut is taken from: 'A' for the 4-field cuts of the kit's own stream."""
    return cut[4] if len(cut) > 4 else 'A'


def file_name(cut):
    """One data file per distinct cut: runs that train on the same tokens at the same length share it (a cut of
    corpus B: B_s..., from B's stream)."""
    start, tokens, length, roff = cut[:4]
    corpus = cut_corpus(cut)
    return ('' if corpus == 'A' else f'{corpus}_') + f's{start}_n{tokens}_L{length}_r{roff}'


def steps(job, T, G, plan):
    """Optimizer steps of a job: [token-level] or [stage 1, stage 2]."""
    if plan is None:
        return [job.N // (G * T)]
    return [plan.stage1.train_iters, plan.stage2.train_iters]


def estimate_seconds(job, step_counts, stage1_export=True):
    """Wall seconds of a job's pipeline alone on the machine (the H100 figures above; CPU runs: meaningless)."""
    tok, patch = STEP_S.get(job.size, STEP_S['M'])
    if len(step_counts) == 1:
        return STARTUP_S + step_counts[0] * tok + EXPORT_S
    # the stage-1 export runs beside stage 2 (CPU work, not on the job's path)
    return 2 * STARTUP_S + step_counts[0] * patch + step_counts[1] * tok + EXPORT_S


def start_order(jobs, seconds):
    """The order the jobs start in: start jobs of continuations first (every continuation waits for one), then the
    first seed's jobs first (if the deadline stops a call, what is lost is the second seed's spread, not a point of
    the map), longest first within a seed (the classic makespan heuristic for parallel slots); ties keep the given
    order."""
    seeds = list(dict.fromkeys(j.seed for j in jobs))
    starts = {start_job(j) for j in jobs} - {None}
    return sorted(jobs, key=lambda j: (j not in starts, seeds.index(j.seed), -seconds[j]))


def schedule(seconds, after, slots, window=None):
    """makespan() with dependencies: ``after[k]`` is the index of the job that job k waits for (None: none), as
    run.py runs them: a waiting job holds no slot; whenever a slot is free, the first job in the given order whose
    start job has finished takes it (with a ``window``: unless its duration exceeds what is left, then it does not
    start, nor does anything waiting for it). Returns (makespan, indices of the jobs that do not start, start times
    (None for those))."""
    n = len(seconds)
    start, end, skipped = [None] * n, [None] * n, []
    pending, t = list(range(n)), 0.0
    while pending:
        for k in list(pending):
            d = after[k]
            if d is not None and d in skipped:
                pending.remove(k)
                skipped.append(k)
                continue
            if d is not None and (end[d] is None or end[d] > t):
                continue
            if sum(1 for e in end if e is not None and e > t) >= max(1, slots):
                break
            pending.remove(k)
            if window is not None and seconds[k] > window - t:
                skipped.append(k)
                continue
            start[k], end[k] = t, t + seconds[k]
        future = [e for e in end if e is not None and e > t]
        if pending and not future:
            if all(after[k] is not None and (after[k] in pending) for k in pending):
                raise ValueError('schedule: a job waits for a job that never starts (a cycle)')
            continue
        if future:
            t = min(future)
    ends = [e for e in end if e is not None]
    return (max(ends) if ends else 0.0), sorted(skipped), start


def makespan(seconds, slots, window=None):
    """Wall time of jobs of these durations started in this order on ``slots`` parallel slots (each job takes the
    slot that frees first), assuming the jobs do not slow one another; with a ``window`` (seconds left for training
    when the first job starts), run.py's rule: a job whose duration exceeds what is left when a slot frees does not
    start. Returns the makespan, or (makespan, indices of the jobs that would not start) with a window."""
    free = [0.0] * max(1, slots)
    skipped = []
    for k, s in enumerate(seconds):
        i = free.index(min(free))
        if window is not None and s > window - free[i]:
            skipped.append(k)
            continue
        free[i] += s
    return max(free) if window is None else (max(free), skipped)


def reserve_start(ends, margins, train_tokens, requested=None, largest_n=None):
    """First stream token of the reserve (the margins of all files are cut from [R, ...)). Default: 2 x the
    largest N (the cut of every call before several N), lowered to the farthest end of a planned cut when the stream
    is too short for that. ValueError when a cut would overlap the reserve or the reserve runs past the stream."""
    end = max(ends)
    if requested is not None:
        r = requested
    else:
        r = 2 * (largest_n or end)
        if train_tokens is not None and r + margins > train_tokens:
            r = end
    if end > r:
        raise ValueError(f'a run trains on the stream up to token {end:,}, past the reserve start {r:,} '
                         '(--reserve_from)')
    if train_tokens is not None and r + margins > train_tokens:
        raise ValueError(f'the reserve [{r:,}, {r + margins:,}) runs past the {train_tokens:,} train tokens of the '
                         'kit: fewer or smaller --tokens, or a lower --reserve_from')
    return r
