#!/usr/bin/env python3
"""Does `llama3_2_plt` at K=1 do any work per training step that stock `llama` (SWIFT_PLT_DISABLE=1) does not?

    python benchmarks/k1_gap_cpu.py WORK_DIR [--iters 4] [--profile-step 3] [--packing true] [--mbs 2] [--gbs 4]
                                             [--dtype bfloat16|float32] [--reuse]

Runs the real `megatron pt` (ms-swift 4.6, CPU harness of tests/harness: gloo, unfused attention, no padding-free,
no fused CE) twice on the harness's tiny Llama, same data, seed and flags: stock `llama` with the plugin disabled,
then `llama3_2_plt --patch_size 1`. The step probe (benchmarks/step_probe) profiles one training step
(torch.profiler key_averages) and digests every micro-batch the model is fed (STEP_PROBE_BATCHES). Then prints:
  * args.json: every key whose value differs;
  * the printed `model_config:` (every field) and `model:` (module tree), class names aside;
  * the batches: per micro-batch, whether every input tensor (dtype, shape, SHA-1) is the same;
  * the profiled step: every op whose count differs, and the ops only one run has;
  * per-step losses and grad norms (expected equal to the last digit: same kernels, same order on CPU);
  * self-CPU time of the profiled step (noise on this machine: a figure, not a verdict).
Not a timing benchmark: the op-level diff is the result. Needs tests/ (the harness) and the plugin installed.
"""
import argparse
import ast
import json
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'tests'))


def run(name, work, model, data, a, model_type, extra, env_extra):
    from harness.cli import CPU_MEGATRON_ARGS, harness_env
    out = os.path.join(work, name)
    os.makedirs(out, exist_ok=True)
    probe = os.path.join(out, 'probe.jsonl')
    for suffix in ('', '.prof.json', '.batches.jsonl'):
        if os.path.exists(probe + suffix):
            os.remove(probe + suffix)
    env = harness_env(env_extra, 1)
    env['PYTHONPATH'] = os.pathsep.join([os.path.join(REPO, 'benchmarks', 'step_probe'), env['PYTHONPATH']])
    env.update({'STEP_PROBE_OUT': probe, 'STEP_PROBE_PROFILE_STEP': str(a.profile_step), 'STEP_PROBE_BATCHES': '1'})
    argv = ['megatron', 'pt', '--model', model, '--model_type', model_type, '--template', 'llama', '--dataset', data,
            '--max_length', str(a.max_length), '--packing', a.packing, '--train_iters', str(a.iters),
            '--micro_batch_size', str(a.mbs), '--global_batch_size', str(a.gbs), '--lr', '1e-3',
            '--lr_warmup_iters', '0', '--logging_steps', '1', '--seed', '7', '--torch_dtype', a.dtype,
            '--bf16', str(a.dtype == 'bfloat16').lower(), '--fp16', 'false', '--save_steps', '1000',
            '--no_save_optim', 'true', '--no_save_rng', 'true', '--save_safetensors', 'false', '--dataset_num_proc', '1',
            '--dataloader_num_workers', '0', '--output_dir', os.path.join(out, 'run'), *CPU_MEGATRON_ARGS, *extra]
    import shutil
    cmd = [shutil.which('megatron', path=env['PATH']), *argv[1:]]
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1500)
    with open(os.path.join(out, 'log.txt'), 'w') as f:
        f.write(proc.stdout)
    if proc.returncode != 0:
        print(proc.stdout[-4000:])
        raise SystemExit(f'{name}: rc={proc.returncode}')
    return out, proc.stdout


def args_json(out):
    for root, _, files in os.walk(os.path.join(out, 'run')):
        if 'args.json' in files:
            with open(os.path.join(root, 'args.json')) as f:
                return json.load(f)
    return {}


def printed(log, key, end):
    i = log.index(key)
    return log[i:log.index(end, i)]


def fields(cfg):
    """The printed ``model_config: Cls(a=1, b=...)`` (up to the next log line) -> ['a=1', 'b=...'], addresses cut."""
    cfg = re.sub(r' at 0x[0-9a-f]+', '', cfg)
    cfg = re.sub(r'^\S+: \w+\(', '', cfg.strip())
    cfg = cfg[:cfg.rindex(')\n')] if ')\n' in cfg else cfg.rstrip(')')
    return re.split(r', (?=[a-z_0-9]+=)', cfg)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('work')
    ap.add_argument('--iters', type=int, default=4)
    ap.add_argument('--profile-step', type=int, default=3)
    ap.add_argument('--packing', default='true')
    ap.add_argument('--max-length', type=int, default=64)
    ap.add_argument('--mbs', type=int, default=2)
    ap.add_argument('--gbs', type=int, default=4)
    ap.add_argument('--rows', type=int, default=400)
    ap.add_argument('--dtype', default='bfloat16', choices=['bfloat16', 'float32'])
    ap.add_argument('--reuse', action='store_true', help='diff the runs already in WORK_DIR')
    a = ap.parse_args()
    from harness.tiny import make_jsonl, make_tiny_llama
    os.makedirs(a.work, exist_ok=True)
    custom = os.path.join(REPO, 'custom_model', 'llama.py')
    runs = {'stock': ('llama', [], {'SWIFT_PLT_DISABLE': '1'}),
            'plt1': ('llama3_2_plt', ['--custom_register_path', custom, '--patch_size', '1'], {})}
    logs, outs = {}, {}
    if not a.reuse:
        model = make_tiny_llama(os.path.join(a.work, 'tiny'))
        data = make_jsonl(os.path.join(a.work, 'data.jsonl'), rows=a.rows)
    for name, (model_type, extra, env) in runs.items():
        if a.reuse:
            outs[name] = os.path.join(a.work, name)
            with open(os.path.join(outs[name], 'log.txt')) as f:
                logs[name] = f.read()
        else:
            outs[name], logs[name] = run(name, a.work, model, data, a, model_type, extra, env)
        print(f'K1GAP ran {name}', flush=True)

    # args.json
    sa, pa = args_json(outs['stock']), args_json(outs['plt1'])
    diff = {k: (sa.get(k, '<absent>'), pa.get(k, '<absent>')) for k in sorted(set(sa) | set(pa))
            if sa.get(k, '<absent>') != pa.get(k, '<absent>') and k not in ('output_dir', 'tensorboard_dir')}
    print(f'K1GAP args.json: {len(sa)} / {len(pa)} keys, {len(diff)} differ (output dirs aside):')
    for k, (s, p) in diff.items():
        print(f'  {k}: stock={str(s)[:110]!s} | plt1={str(p)[:110]!s}')
    # model_config and model tree
    cs, cp = (fields(printed(logs[n], 'model_config: ', 'Loading')) for n in ('stock', 'plt1'))
    only_s, only_p = [f for f in cs if f not in cp], [f for f in cp if f not in cs]
    print(f'K1GAP model_config: {len(cs)} / {len(cp)} fields; only stock: {only_s}; only plt1: {only_p}')
    ms, mp = (printed(logs[n], '] model: ', 'model_parameter_info') for n in ('stock', 'plt1'))
    same_tree = re.sub(r'\bPLTGPTModel\b', 'GPTModel', mp) == ms
    print(f'K1GAP model tree equal (class name PLTGPTModel -> GPTModel): {same_tree} ({ms.count(chr(10))} lines)')
    # batches
    bs, bp = (read_jsonl(os.path.join(outs[n], 'probe.jsonl.batches.jsonl')) for n in ('stock', 'plt1'))
    same = [x == y for x, y in zip(bs, bp)]
    print(f'K1GAP batches: {len(bs)} / {len(bp)} micro-batch forwards, {sum(same)} identical '
          f'(keys: {sorted(k for k in bs[0] if k not in ("step", "n_args"))})')
    for x, y in zip(bs, bp):
        if x != y:
            print('  differs:', {k: (x.get(k), y.get(k)) for k in set(x) | set(y) if x.get(k) != y.get(k)})
    ex = bs[0]
    print('  first micro-batch:', {k: v[:2] if isinstance(v, list) else v for k, v in ex.items()})
    # profile
    ps, pp = ({r['name']: r for r in json.load(open(os.path.join(outs[n], 'probe.jsonl.prof.json')))['rows']}
              for n in ('stock', 'plt1'))
    names = sorted(set(ps) | set(pp))
    cnt = [(n, ps.get(n, {}).get('count', 0), pp.get(n, {}).get('count', 0)) for n in names]
    dif = [c for c in cnt if c[1] != c[2]]
    print(f'K1GAP profiled step {a.profile_step}: {len(ps)} / {len(pp)} distinct ops, {sum(c[1] for c in cnt)} / '
          f'{sum(c[2] for c in cnt)} op calls; {len(dif)} ops differ in count:')
    for n, c1, c2 in dif:
        print(f'  {n}: stock {c1}, plt1 {c2}')
    top = lambda rows: sum(r['self_cpu_us'] for r in rows.values()) / 1e3  # noqa: E731
    print(f'K1GAP self CPU of the profiled step: stock {top(ps):.1f} ms, plt1 {top(pp):.1f} ms (noise, 2 shared cores)')
    # losses
    ls, lp = (read_jsonl(os.path.join(outs[n], 'probe.jsonl')) for n in ('stock', 'plt1'))
    for x, y in zip(ls, lp):
        print(f'K1GAP step {x["step"]}: loss {x["loss"]!r} / {y["loss"]!r} equal={x["loss"] == y["loss"]}; grad_norm '
              f'{x["grad_norm"]!r} / {y["grad_norm"]!r} equal={x["grad_norm"] == y["grad_norm"]}')


if __name__ == '__main__':
    main()
