"""Quality benchmark: does the two-stage PLT recipe reach token-level quality at about half the compute?

    python benchmarks/quality/run.py --kit KIT --work W --out OUT [--sizes S M] [--tokens 10M [20M ...]]
        [--runs a ah b c b_k2 ...] [--seeds 42 [43 ...]] [--jobs SIZE:RUN:N:SEED ...] [--no_gpu_lock] [--plan_only]
    (on a GPU machine: bash benchmarks/quality/run_gpu.sh, which calls this)

Per model size (make_models.py), on the same train-document stream and the same held-out rows:
  (a) token-level baseline: `megatron pt --model_type llama --train_iters N/(G*T)`        (compute 1.0)
      (tinyMoE / tinyHybrid: --model_type qwen3_moe / qwen3_5, make_models.FAMILY_SIZES)
  (a½) `ah`: (a) on N/2 tokens, the first half of (b)'s data                                (compute 0.5)
  (b) `swift-plt-two-stage --tokens N --patch_size 4 --lam 2/3`                             (compute ~0.5)
  (c) `swift-plt-two-stage --tokens 2N --patch_size 4 --lam 2/3`                            (compute ~1.0)
  sweeps: b/c at another K or λ, e.g. --runs a b b_k2 b_l12 (variants.py)
Several N (--tokens) and seeds (--seeds) make a run list of jobs (size, run, N, seed): jobs.py says which (the seed
rule) and how each is named; the list, each job's steps and an estimate of its time are printed before anything
starts (--plan_only: only that). All runs: the same T, global batch, peak LR, LR schedule shape (warm-up 5% of the
steps, cosine to 10% of the peak; stage 2 a fresh schedule with the same peak, as in the paper). A job's seed sets
megatron's --seed and --data_seed and its model's random init (jobs.init_seed). Data (make_run_data.py): (a) trains
on the stream's tokens [0, N); (b) stage 1 on [0, λN) cut into rows of K*T tokens, stage 2 on [λN, N) in rows of T
tokens, so (a) and (b) see the same documents and no stage repeats the other's data; (c) likewise on [0, 2N) (one
epoch). One file per distinct cut, shared by every job (any size or seed) that trains on it. Every final model is
exported to the family's plain HF model (swift-plt-export-vanilla, also for (a)) and so is the end of stage 1 of (b)
and (c) (unless --no_stage1_export); eval_heldout.py scores the models of the jobs that finished, with plain
transformers.

GPU time: the runs start concurrently (start-up is CPU work) but their training loops take turns on the GPU
(gpu_lock.py: an fcntl lock from the first to the last step), so each run's GPU seconds are its training loops
alone on the GPU (`train_seconds`, summed over stages). Start-up, export and eval are not counted. --no_gpu_lock:
the loops run at once (for quality-only calls such as the regime map: these sizes are host-bound); the seconds are
then not GPU time alone.

Deadline (--deadline, seconds from the start): a job starts only while time is left (on a GPU, only if its estimate
fits in what is left); jobs start in jobs.start_order (first seed first, longest first); a step still running at the
deadline is killed. A job that did not finish is reported with its status (not started / killed / failed), never
with a loss.

Continued pretraining (README.md, "Continued pretraining"): --continue_from N_A [--corpus B] makes every run of the
cross product a continuation on corpus B (KIT/corpora/B, prepare_data.py --add_corpus) from the exported HF model of
(a) on N_A tokens of A at the same size and seed (the start job, added to the call and started first; jobs.py). A
continuation waits for its start job (without holding a --max_parallel slot) and starts from its weights:
`megatron pt --model START_HF` for (a), `swift-plt-two-stage --model START_HF` for (b)/(c) (stage 1 is `megatron pt
--model START_HF`, which loads the HF weights). --start_models DIR_OR_TAR reuses start models of an earlier call
(--export_starts TAR writes them: one folder per start job id); a reused start is not trained again. Every model is
scored on held-out A and on the held-out rows of each corpus of the call (eval.jsonl names NAME and NAME@B);
continued.py writes continued.md / continued.png.

Other structures (README.md, "MoE and hybrid"): a size's model type and the flags its structure needs come from
make_models.py and launch.py: a hybrid (Gated DeltaNet) trains on megatron-core's torch Gated DeltaNet on padded rows
(--gdn torch, the default) and is scored on transformers' torch one (eval_heldout.py, QUAL_EVAL_GDN=torch).
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from launch import (KILLED, LR, NOT_STARTED, Runner, exe, export_args, megatron_common, recipe_cmd,  # noqa: E402,F401
                    step_status, structure_env, token_level_cmd)
from make_models import keep_tokenizer_class  # noqa: E402


def plan_call(a, make_plan, parse_tokens, train_tokens=None, reused=()):
    """The jobs of the call, each with its plan, data cuts, steps and estimate; the reserve start of each corpus
    ({corpus: token}; ``train_tokens``: {corpus: stream tokens} where known). Prints the list. Start jobs in
    ``reused`` (their models come from --start_models) train nothing: no data, estimate 0."""
    import jobs as J
    tokens = [parse_tokens(x) for x in a.tokens]
    extra = [J.parse_job_spec(x, parse_tokens) for x in a.jobs]
    from_n = parse_tokens(a.continue_from) if a.continue_from else None
    try:
        job_list = J.expand(a.sizes, a.runs, tokens, a.seeds, a.all_seeds, extra, a.corpus, from_n)
    except ValueError as e:
        raise SystemExit(str(e))
    if from_n and not a.runs:  # --continue_from with no --runs: the start models alone (--export_starts)
        job_list = J.with_starts([J.Job(z, 'a', from_n, s) for z in a.sizes for s in a.seeds] + job_list)
    if not job_list:
        raise SystemExit('no runs: give --runs or --jobs')
    train_tokens = train_tokens or {}
    T, G = a.seq, a.gbs
    info = {}
    for job in job_list:
        try:
            plan, cuts = J.job_plan(job, T, G, a.stage1_batch, make_plan)
        except ValueError as e:
            raise SystemExit(f'{J.job_id(job)}: {e}')
        st = J.steps(job, T, G, plan)
        start = J.start_job(job)
        if job in reused:
            cuts = {}
        info[job] = {'id': J.job_id(job), 'plan': plan, 'cuts': cuts, 'steps': st,
                     'files': {k: J.file_name(c) for k, c in cuts.items()},
                     'estimate_s': 0.0 if job in reused else J.estimate_seconds(job, st),
                     'start': J.job_id(start) if start else None, 'reused': job in reused}
    cuts = {J.file_name(c): c for i in info.values() for c in i['cuts'].values()}
    reserve = {}
    for corpus in dict.fromkeys(J.cut_corpus(c) for c in cuts.values()):
        mine = [c for c in cuts.values() if J.cut_corpus(c) == corpus]
        ns = [j.N for j in job_list if j.corpus == corpus and j not in reused]
        if corpus == 'A' and not from_n and tokens:
            ns = tokens  # as before continuations: 2 x the largest --tokens
        try:
            reserve[corpus] = J.reserve_start([c[0] + c[1] for c in mine],
                                              max(c[3] + int(c[1] * J.MARGIN) for c in mine),
                                              train_tokens.get(corpus),
                                              a.reserve_from if corpus == 'A' else a.cont_reserve_from, max(ns))
        except ValueError as e:
            raise SystemExit(f'corpus {corpus}: {e}')
    order = J.start_order(job_list, {j: info[j]['estimate_s'] for j in job_list})
    est = [info[j]['estimate_s'] for j in order]
    after = [order.index(J.start_job(j)) if J.start_job(j) else None for j in order]
    chained = any(x is not None for x in after)
    P = min(a.max_parallel or len(job_list), len(job_list))
    lines = [(f'planned runs: {len(job_list)} (start order: '
              + ('start models first, then ' if chained else '') + 'first seed first, longest first); data: '
              f'{len(cuts)} files, reserve from token '
              + ', '.join(f'{v:,}' + (f' ({k})' if len(reserve) > 1 or k != 'A' else '') for k, v in reserve.items())),
             '| job | steps | est. s | data files |', '| --- | ---: | ---: | --- |']
    for j in order:
        i = info[j]
        files = ', '.join(i['files'].values()) or ('— (reused start model)' if i['reused'] else '—')
        lines.append(f"| {i['id']} | {' + '.join(map(str, i['steps']))} | {i['estimate_s']:.0f} | {files}"
                     + (f" (after {i['start']})" if i['start'] else '') + ' |')
    span = J.schedule(est, after, P)[0] if chained else J.makespan(est, P)
    lines.append(f'estimate (H100 figures of jobs.py for T=512, G=32; meaningless on CPU): {sum(est):.0f} s of '
                 f'pipelines alone; {P} at once in this order'
                 + (', each continuation after its start model' if chained else '')
                 + f': {span:.0f} s + ~60 s of models and data, if start-ups do not slow one another (measured up '
                 f'to 4 at once on 16 cores; 9 at once made each 2-5x slower). Eval ~2 s a model'
                 + (' and held-out set' if any(j.corpus != 'A' for j in job_list) else '')
                 + f'. Deadline: {a.deadline:.0f} s.')
    if not a.cpu:
        late = J.schedule(est, after, P, a.deadline - 60)[1]
        lines.append('by this estimate, with ~60 s of models and data before the first job: '
                     + (f"{len(late)} job(s) would not start before the deadline: "
                        f"{', '.join(info[order[k]]['id'] for k in late)}" if late else 'every job starts in time'))
    print('\n'.join(lines), flush=True)
    return job_list, order, info, cuts, reserve


class OrderedSlots:
    """--max_parallel slots taken in the start order (jobs.start_order): a free slot goes to the first job in that
    order among those waiting for one (continuations wait only once their start model is there), as jobs.schedule
    assumes; a plain semaphore would let the continuations woken together by their start model race for it."""

    def __init__(self, n, order):
        self.free, self.rank, self.waiting = n, {j: i for i, j in enumerate(order)}, set()
        self.cv = threading.Condition()

    def acquire(self, job):
        with self.cv:
            self.waiting.add(job)
            self.cv.wait_for(lambda: self.free > 0 and min(self.waiting, key=self.rank.__getitem__) == job)
            self.waiting.remove(job)
            self.free -= 1
            self.cv.notify_all()

    def release(self):
        with self.cv:
            self.free += 1
            self.cv.notify_all()


def corpus_kit(kit, corpus):
    """The kit folder of a corpus: KIT for A, KIT/corpora/NAME for the others (prepare_data.py --add_corpus)."""
    return kit if corpus == 'A' else os.path.join(kit, 'corpora', corpus)


def start_model_names(path):
    """The top-level folder names in --start_models PATH (a folder, or a tar as --export_starts writes)."""
    if path is None:
        return set()
    if os.path.isfile(path):
        with tarfile.open(path) as t:
            return {n.split('/')[0] for n in t.getnames()}
    return set(os.listdir(path)) if os.path.isdir(path) else set()


def find_start_models(path, work, ids):
    """{start id: HF dir} of the start models in --start_models PATH (a folder of ID/ folders, or a .tar of them as
    --export_starts writes), among ``ids``; a tar is unpacked into WORK/start_models."""
    if path is None:
        return {}
    if os.path.isfile(path):
        dest = os.path.join(work, 'start_models')
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        with tarfile.open(path) as t:
            for m in t.getmembers():
                if m.name.startswith('/') or '..' in m.name.split('/') or not (m.isfile() or m.isdir()):
                    raise SystemExit(f'--start_models {path}: unexpected member {m.name!r}')
            t.extractall(dest)
        path = dest
    elif not os.path.isdir(path):
        raise SystemExit(f'--start_models {path}: neither a folder nor a tar')
    return {i: os.path.join(path, i) for i in sorted(ids) if os.path.exists(os.path.join(path, i, 'config.json'))}


def export_starts(path, models):
    """--export_starts: a tar of the start models ({id: HF dir}), one ID/ folder each (read by --start_models)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with tarfile.open(path, 'w') as t:
        for i, d in sorted(models.items()):
            t.add(d, arcname=i)
    print(f'start models {sorted(models)} -> {path} ({os.path.getsize(path) / 2**20:.1f} MiB)', flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--kit', required=True, help='prepare_data.py output (tokenizer, train_docs, heldout_ids)')
    ap.add_argument('--work', required=True)
    ap.add_argument('--out', required=True)
    ap.add_argument('--sizes', nargs='+', default=['XS', 'S', 'M'])
    ap.add_argument('--tokens', nargs='+', default=['10000000'],
                    help='N, one or more (integers, 1e7, 10M, 2.5M): every run of --runs at every N')
    ap.add_argument('--seeds', nargs='+', type=int, default=[42],
                    help='run seeds (--seed, --data_seed, model init); 42 first keeps earlier calls comparable. '
                    '(a) takes only the first unless it is the (a½) of a (b) run of the call (jobs.py)')
    ap.add_argument('--all_seeds', action='store_true', help='(a) too at every seed')
    ap.add_argument('--seq', type=int, default=512, help='T')
    ap.add_argument('--gbs', type=int, default=32)
    ap.add_argument('--mbs', type=int, default=32)
    ap.add_argument('--lr', type=float, default=None)
    ap.add_argument('--logging_steps', type=int, default=5)
    ap.add_argument('--num_proc', type=int, default=2)
    ap.add_argument('--runs', nargs='*', default=['a', 'b', 'c'],
                    help='a, ah (= a on N/2), b, c and sweep variants of b/c such as b_k2, b_k8, b_l12, c_l34 '
                    '(variants.py)')
    ap.add_argument('--jobs', nargs='+', default=[], metavar='SIZE:RUN:N:SEED',
                    help='single runs added to the cross product, e.g. tiny:b_k2:20000000:42')
    ap.add_argument('--stage1_batch', default='tokens', choices=['tokens', 'sequences'],
                    help="the recipe's --stage1_batch: stage 1 takes G/K sequences of K*T tokens per step (tokens, "
                    "the paper's set-up and the recipe's default) or G (sequences)")
    ap.add_argument('--deadline', type=float, default=420,
                    help='seconds from the start for models, data, all training and exports (then eval, report)')
    ap.add_argument('--max_parallel', type=int, default=0,
                    help='pipelines (one job) at once; 0 = all. Start-up is CPU-bound: 9 at once on 16 '
                    'cores made each start-up 2-5x slower and the training steps slower too')
    ap.add_argument('--no_gpu_lock', action='store_true',
                    help='training loops run at once instead of one at a time (no GPU timing; quality only)')
    ap.add_argument('--no_stage1_export', action='store_true',
                    help='no HF export (and no held-out loss) of the end of stage 1: one launch less per (b)/(c)')
    ap.add_argument('--reserve_from', default=None,
                    help='first stream token of the reserve (default: 2 x the largest N, or the farthest cut when '
                    'the stream is too short); give the same value to every call of one study')
    ap.add_argument('--continue_from', default=None, metavar='N_A',
                    help='continued pretraining: every run of --runs/--tokens/--seeds trains on --corpus, starting '
                    'from the exported (a) model on N_A tokens of A of its size and seed (added to the call, run '
                    'first); with no --runs, the start models alone')
    ap.add_argument('--corpus', default='B', help='with --continue_from: the corpus of the continuations '
                    '(KIT/corpora/NAME, prepare_data.py --add_corpus NAME)')
    ap.add_argument('--cont_reserve_from', default=None,
                    help="first token of the reserve of the continuation corpus's stream (default: 2 x the largest N "
                    'on it); give the same value to every call of one study')
    ap.add_argument('--start_models', default=None, metavar='DIR_OR_TAR',
                    help='start models of an earlier call (--export_starts): a start job found there is not run again')
    ap.add_argument('--export_starts', default=None, metavar='TAR',
                    help='write the start models this call trained (exported HF) into TAR, one folder per start job id')
    ap.add_argument('--gdn', default='torch', choices=['torch', 'fla'],
                    help="a hybrid size's Gated DeltaNet in training: megatron-core's torch code on padded rows "
                    "(torch: no Triton; fla 0.6 refuses its backward on Hopper GPUs with Triton < 3.7.1) or "
                    "flash-linear-attention's kernels on packed rows (fla)")
    ap.add_argument('--plan_only', action='store_true', help='print the run list and the estimate; run nothing')
    ap.add_argument('--cpu', action='store_true', help='CPU dry run through the test harness flags')
    a = ap.parse_args()
    a.kit = os.path.abspath(a.kit)  # the eval runs in /tmp
    sys.path.insert(0, REPO)
    sys.path.insert(0, HERE)
    import jobs as J
    from variants import parse_run

    from swift_plt.recipe.plan import make_plan, parse_tokens
    if a.reserve_from is not None:
        a.reserve_from = parse_tokens(a.reserve_from)
    if a.cont_reserve_from is not None:
        a.cont_reserve_from = parse_tokens(a.cont_reserve_from)
    try:
        extra = J.with_starts([J.parse_job_spec(x, parse_tokens) for x in a.jobs])
    except ValueError as e:
        raise SystemExit(str(e))
    corpora = list(dict.fromkeys(['A'] + ([a.corpus] if a.continue_from else []) + [j.corpus for j in extra]))
    kits = {}
    for c in corpora:
        manifest = os.path.join(corpus_kit(a.kit, c), 'manifest.json')
        kits[c] = {}
        if os.path.exists(manifest):
            with open(manifest) as f:
                kits[c] = json.load(f)
        elif c != 'A' and not a.plan_only:
            raise SystemExit(f'corpus {c}: no {manifest} (prepare_data.py CODE_DIR {a.kit} --add_corpus {c})')
    kit = kits['A']
    tok_json = os.path.join(a.kit, 'tokenizer', 'tokenizer.json')
    for c in corpora[1:]:  # the same token ids as A: the kit's own tokenizer
        want = (kits[c].get('tokenizer') or {}).get('sha256')
        if want and os.path.exists(tok_json):
            with open(tok_json, 'rb') as f:
                if hashlib.sha256(f.read()).hexdigest() != want:
                    raise SystemExit(f'corpus {c}: tokenized with another tokenizer than {tok_json} (rerun '
                                     f'prepare_data.py --add_corpus {c} on this kit)')
    t0 = time.time()
    wanted = {J.job_id(j) for j in extra if any(J.start_job(x) == j for x in extra)}
    if a.continue_from:
        wanted |= {J.job_id(J.Job(z, 'a', parse_tokens(a.continue_from), s)) for z in a.sizes for s in a.seeds}
    if a.plan_only:
        found = {i: None for i in sorted(start_model_names(a.start_models) & wanted)}
    else:
        os.makedirs(a.work, exist_ok=True)
        found = find_start_models(a.start_models, a.work, wanted)
    reused = {J.parse_job_id(i) for i in found}
    job_list, order, info, cuts, reserve = plan_call(a, make_plan, parse_tokens,
                                                     {c: k.get('train_tokens') for c, k in kits.items()}, reused)
    if a.start_models:
        print(f'start models reused (--start_models): {sorted(found) or "none found"}', flush=True)
    if a.plan_only:
        return 0
    os.makedirs(a.work, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    T, G = a.seq, a.gbs
    sizes = list(dict.fromkeys(j.size for j in job_list))

    # models: one per size and init seed (continuations and reused start models need none)
    keys = list(dict.fromkeys([J.model_key(s, J.FIRST_SEED) for s in sizes] +
                              [J.model_key(j.size, j.seed) for j in job_list if j.from_n is None and
                               j not in reused]))
    models = {}
    r = subprocess.run([sys.executable, os.path.join(HERE, 'make_models.py'), os.path.join(a.kit, 'tokenizer'),
                        os.path.join(a.work, 'models'), *keys], capture_output=True, text=True, check=True)
    for line in r.stdout.splitlines():
        if line.startswith('{'):
            m = json.loads(line)
            models[m['key']] = m
    print(f'models: {json.dumps(models)}', flush=True)

    # data: one file per distinct cut, one process per file (a cut of corpus B from B's kit and reserve)
    data = os.path.join(a.work, 'data')
    specs = [f'{name}:{c[0]}:{c[1]}:{c[2]}:{c[3]}' for name, c in cuts.items()]
    cutters = [subprocess.Popen([sys.executable, os.path.join(HERE, 'make_run_data.py'),
                                 corpus_kit(a.kit, J.cut_corpus(c)), data, '--reserve_from',
                                 str(reserve[J.cut_corpus(c)]), '--margin', str(J.MARGIN), '--spec', sp, '--stats',
                                 f'data_stats_{sp.split(":")[0]}.json']) for sp, c in zip(specs, cuts.values())]
    if any(p.wait() for p in cutters):
        raise SystemExit('make_run_data.py failed')
    print(f'data ready: {time.time() - t0:.0f}s', flush=True)

    runner = Runner(a, t0)
    status = {}
    finished = {j: threading.Event() for j in job_list}  # set when a job ends, however it ends

    def hf_dir(job):
        jid = J.job_id(job)
        return found[jid] if jid in found else os.path.join(a.work, 'runs', jid, 'hf')

    for job in reused:
        status[job] = 'done'
        finished[job].set()

    def pipeline(job):
        i = info[job]
        jid = i['id']
        left = runner.deadline - time.time()
        if not a.cpu and i['estimate_s'] > left:
            status[job] = f"not started (estimate {i['estimate_s']:.0f} s > {left:.0f} s left)"
            runner.failed.append(f'{jid}: {status[job]}')
            return
        start = J.start_job(job)  # a continuation starts from the start model's HF weights (--model)
        m = {'dir': hf_dir(start)} if start else models[J.model_key(job.size, job.seed)]
        out = os.path.join(a.work, 'runs', jid)
        shutil.rmtree(out, ignore_errors=True)  # never a model of an earlier call in the same work dir
        env = structure_env(a, job.size)  # e.g. a hybrid on megatron-core's torch Gated DeltaNet
        logs = os.path.join(out, 'logs')
        files = {k: os.path.join(data, f + '.jsonl') for k, f in i['files'].items()}
        if job.run == 'a':
            cmd = token_level_cmd(a, job.size, job.seed, m['dir'], files['a'], i['steps'][0],
                                  os.path.join(out, 'token'))
            why = step_status('train', runner.run(f'{jid} train', cmd, os.path.join(logs, 'train.log'), env))
            if why is None:
                why = step_status('export', runner.run(f'{jid} export', [
                    exe('swift-plt-export-vanilla'), '--checkpoint', os.path.join(out, 'token'), '--output_dir',
                    os.path.join(out, 'hf'), *export_args(a)], os.path.join(logs, 'export_run.log'), env))
            keep_tokenizer_class(m['dir'], os.path.join(out, 'hf'))
            status[job] = why or 'done'
            return
        base, Kr, lam_r = parse_run(job.run)
        plan = i['plan']
        recipe = recipe_cmd(a, job.size, job.seed, m['dir'], out, job.N if base == 'b' else 2 * job.N, Kr, lam_r,
                            plan.stage1.global_batch_size, files)
        why = step_status('stage 1', runner.run(f'{jid} stage1', recipe + ['--stage', '1'],
                                                os.path.join(out, 'runner_stage1.log'), env))
        if why:
            status[job] = why
            return
        t = None
        if not a.no_stage1_export:
            t = threading.Thread(target=runner.run, args=(f'{jid} export stage1', [
                exe('swift-plt-export-vanilla'), '--checkpoint', os.path.join(out, 'stage1_patch'), '--output_dir',
                os.path.join(out, 'hf_stage1'), *export_args(a)], os.path.join(out, 'export_stage1_run.log'), env))
            t.start()
        why = step_status('stage 2 + export', runner.run(f'{jid} stage2+export', recipe,
                                                          os.path.join(out, 'runner_all.log'), env))
        if t:
            t.join()
        for hf in ('hf', 'hf_stage1'):
            keep_tokenizer_class(m['dir'], os.path.join(out, hf))
        status[job] = why or 'done'

    slots = OrderedSlots(a.max_parallel or len(job_list), order)

    def limited(job):
        try:
            start = J.start_job(job)
            if start is not None:  # a continuation: its start model first (waiting holds no slot)
                finished[start].wait()
                if status.get(start) != 'done':
                    status[job] = f"not started (start model {J.job_id(start)}: {status.get(start)})"
                    runner.failed.append(f"{info[job]['id']}: {status[job]}")
                    return
            slots.acquire(job)
            try:
                pipeline(job)
            except Exception as e:  # noqa: BLE001 -- one job's error must not stop the others
                status[job] = f'error: {type(e).__name__}: {e}'
                runner.failed.append(f"{info[job]['id']}: {status[job]}")
            finally:
                slots.release()
        finally:
            finished[job].set()

    threads = []
    for job in order:  # threads queue on the semaphore in this order (jobs.start_order)
        if job in reused:
            continue
        th = threading.Thread(target=limited, args=(job,))
        th.start()
        threads.append(th)
        time.sleep(0.05)
    for th in threads:
        th.join()
    done = [j for j in job_list if status.get(j) == 'done']
    print(f'training + exports done: {time.time() - t0:.0f}s; {len(done)}/{len(job_list)} runs finished; '
          f'failed: {runner.failed}', flush=True)
    start_ids = wanted | {J.job_id(s) for s in (J.start_job(j) for j in job_list) if s}
    if a.export_starts:
        trained = {J.job_id(j): hf_dir(j) for j in done if J.job_id(j) in start_ids and j not in reused}
        if trained:
            export_starts(a.export_starts, trained)

    # held-out evaluation (the finished runs only): plain transformers, plugin disabled; every model on held-out A
    # and, in a call with continuations, on the held-out rows of their corpus too (eval.jsonl: NAME@B)
    evals = os.path.join(a.out, 'eval.jsonl')
    if os.path.exists(evals):
        os.remove(evals)
    targets = [f'{s}_init={models[J.model_key(s, J.FIRST_SEED)]["dir"]}' for s in sizes]
    for job in done:
        out = os.path.join(a.work, 'runs', info[job]['id'])
        if job.run != 'a' and os.path.isdir(os.path.join(out, 'hf_stage1')):  # the end of stage 1
            targets.append(f"{info[job]['id']}_stage1={os.path.join(out, 'hf_stage1')}")
        targets.append(f"{info[job]['id']}={hf_dir(job)}")
    env = dict(os.environ, SWIFT_PLT_DISABLE='1', QUAL_EVAL_GDN='torch')  # a hybrid: no Triton compile in the eval
    if a.cpu:
        env.pop('PYTHONPATH', None)
        env['QUAL_EVAL_ROWS'] = '8'  # the CPU dry run scores 8 rows, not all 512
    ids = ','.join([os.path.join(a.kit, 'heldout_ids.npy')] +
                   [f"{c}={os.path.join(corpus_kit(a.kit, c), 'heldout_ids.npy')}" for c in corpora[1:]])
    r = subprocess.run([sys.executable, os.path.join(HERE, 'eval_heldout.py'), ids,
                        evals, *targets], env=env, cwd='/tmp', capture_output=True, text=True, check=False)
    with open(os.path.join(a.out, 'eval.log'), 'w') as f:
        f.write(r.stdout + r.stderr)
    print(''.join(line + '\n' for line in r.stdout.splitlines() if line.startswith('EVAL')), flush=True)

    runs = list(dict.fromkeys(j.run for j in job_list))
    meta = {'T': T, 'G': G, 'stage1_batch': a.stage1_batch, 'tokens': sorted({j.N for j in job_list}),
            'seeds': a.seeds, 'gpu_lock': not a.no_gpu_lock, 'reserve_from': reserve.get('A'),
            'reserve_from_corpora': reserve,
            'kit': {'path': a.kit, 'train_tokens': kit.get('train_tokens'), 'vocab': kit.get('vocab')},
            'corpora': {c: {'path': corpus_kit(a.kit, c), 'train_tokens': kits[c].get('train_tokens'),
                            'heldout_rows': kits[c].get('heldout_rows'), 'source': kits[c].get('source')}
                        for c in corpora[1:]},
            'jobs': [{'id': info[j]['id'], 'size': j.size, 'run': j.run, 'N': j.N, 'seed': j.seed,
                      'corpus': j.corpus, 'from_n': j.from_n, 'start': info[j]['start'],
                      'reused_from': found.get(info[j]['id']),
                      'init_seed': J.init_seed(j.seed), 'status': status.get(j, 'not started'),
                      'dir': os.path.join(a.work, 'runs', info[j]['id']), 'steps': info[j]['steps'],
                      'estimate_s': round(info[j]['estimate_s']), 'files': info[j]['files'],
                      'a_iters': j.N // (G * T),
                      'K': parse_run(j.run)[1], 'lam': str(parse_run(j.run)[2]),
                      'G1': info[j]['plan'].stage1.global_batch_size if info[j]['plan'] else None,
                      'plan': info[j]['plan'].to_dict() if info[j]['plan'] else None} for j in job_list],
            'models': {s: models[J.model_key(s, J.FIRST_SEED)] for s in sizes},
            'init_models': models, 'sizes': sizes, 'runs': runs,
            'lr': {s: a.lr or LR[s] for s in sizes}, 'mbs': a.mbs, 'failed': runner.failed,
            'timeline': [dict(x, start=round(x['start'] - t0, 1)) for x in runner.timeline],
            'wall_seconds': time.time() - t0, 'cpu': a.cpu, 'specs': specs, 'argv': sys.argv[1:]}
    with open(os.path.join(a.out, 'meta.json'), 'w') as f:
        json.dump(meta, f, indent=1, default=str)
    subprocess.run([sys.executable, os.path.join(HERE, 'report.py'), a.work, a.out], check=False)
    if any(j.from_n for j in job_list):
        subprocess.run([sys.executable, os.path.join(HERE, 'continued.py'), os.path.join(a.out, 'results.json'),
                        '--md', os.path.join(a.out, 'continued.md'), '--png', os.path.join(a.out, 'continued.png')],
                       check=False)
    return 1 if len(done) < len(job_list) else 0


if __name__ == '__main__':
    sys.exit(main())
