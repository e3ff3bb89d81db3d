"""Critic training checks of critic_train.sh, critic_cp.sh and layouts.sh (runs on CPU too, under tests/harness).

1. MegatronCritic (swift_plt.critic.engine) built the way ms-swift builds its models; one process per rank:
    torchrun --nproc_per_node 2 tests/gpu/critic_checks.py --model CRITIC_DIR --tp 2 --json OUT/tp2.json
    python tests/gpu/critic_checks.py --compare OUT/1gpu.json OUT/tp2.json OUT/pp2.json   # -> ENGINE lines
2. Summaries of `megatron sft` critic runs from their stdout logs (ms-swift's printed log dicts):
    python tests/gpu/critic_checks.py --curve NAME RUN.log                 # -> CURVE line
    python tests/gpu/critic_checks.py --resume NAME FULL.log RESUMED.log   # -> RESUME line
    python tests/gpu/critic_checks.py --cp NAME REF_1GPU.log CP2.log       # -> CURVE + CP lines (critic_cp.sh)

Model: MegatronArguments(model_type=llama3_2_critic, tp, pp, bf16) -> swift.megatron.model.get_mcore_model +
bridge.load_weights -> swift's wrap_model (Float16Module + megatron DDP) -> get_megatron_optimizer (Adam, lr 1e-5).
Batch: fixed random ids, one left-padded row, responses of R tokens at the end (verl layout), returns in [-1, 1].
Recorded (last rank): compute_values before any update, the metrics of 3 update_critic steps, compute_values after.
CPU dry run (tests/harness): SWIFT_PLT_CPU_HARNESS=1 PYTHONPATH=tests/harness/site python tests/gpu/critic_checks.py
  --model DIR --json x.json --dtype fp32 --mg-kwargs '{"use_cpu_initialization": true, "attention_backend":
  "unfused", "ddp_backend": "gloo", "perform_initialization": true, "use_distributed_optimizer": false}'
"""
import argparse
import json
import os

import torch

B, S, R, STEPS, LR = 4, 64, 24, 3, 1e-5


def make_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, 300, (B, S), generator=g)
    attention_mask = torch.ones(B, S, dtype=torch.long)
    attention_mask[1, :7] = 0  # left-padded prompt
    input_ids[1, :7] = 3
    returns = torch.rand(B, R, generator=g) * 2 - 1
    mask = torch.ones(B, R)
    mask[2, -5:] = 0  # a response that ended early
    return input_ids, attention_mask, returns, mask


def build(model_dir, tp, pp, dtype, mg_kwargs):
    """ms-swift's way (MegatronArguments initialises torch.distributed + megatron from the torchrun env)."""
    import swift_plt.plugin.import_hook as activation
    activation.install()  # no-op when the .pth startup hook already ran
    from swift_plt.plugin.register import register_all
    register_all()
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from swift.megatron.arguments import MegatronArguments
    from swift.megatron.model import get_mcore_model
    from swift.megatron.utils import wrap_model
    from swift.model import get_processor
    kw = dict(model=model_dir, model_type='llama3_2_critic', torch_dtype=dtype, bf16=dtype == torch.bfloat16,
              fp16=False, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, padding_free=False,
              recompute_granularity='none', seed=42, micro_batch_size=1, global_batch_size=1, finetune=True,
              no_save_optim=True, no_save_rng=True, no_load_optim=True, no_load_rng=True,
              attention_backend='fused')  # ms-swift's default (flash) needs flash-attn, an optional install
    kw.update(mg_kwargs)
    args = MegatronArguments(**kw)
    hf_config = get_processor(model_dir, model_type='llama3_2_critic').model_info.config
    models = get_mcore_model(args, hf_config)
    models[0].config.bridge.load_weights(models, model_dir)
    models = wrap_model(args, models)
    opt = OptimizerConfig(optimizer='adam', lr=LR, weight_decay=0.0, clip_grad=0.0, bf16=args.bf16, fp16=False,
                          params_dtype=dtype, use_distributed_optimizer=args.use_distributed_optimizer)
    return args, models, get_megatron_optimizer(opt, models)


def run(a):
    for k, v in dict(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0', LOCAL_WORLD_SIZE='1', MASTER_ADDR='127.0.0.1',
                     MASTER_PORT=str(a.port)).items():
        os.environ.setdefault(k, v)  # a plain `python` run is a world of one
    from swift_plt.critic.engine import MegatronCritic, response_to_values
    dtype = {'bf16': torch.bfloat16, 'fp32': torch.float32}[a.dtype]
    _, models, optimizer = build(a.model, a.tp, a.pp, dtype, json.loads(a.mg_kwargs))
    critic = MegatronCritic(models, optimizer, micro_batch_size=a.micro_batch_size)
    input_ids, attention_mask, returns, mask = make_batch()
    batch = {'input_ids': input_ids, 'attention_mask': attention_mask}
    before = critic.compute_values(batch)
    batch.update(returns=response_to_values(returns, S), value_mask=response_to_values(mask, S))
    metrics = [critic.update_critic(batch) for _ in range(STEPS)]
    after = critic.compute_values(batch)
    rank = int(os.environ.get('RANK', 0))
    # every rank holds the values (broadcast over the pipeline group); check that, then let the last rank write
    import torch.distributed as dist
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world > 1:
        ref = before.clone()
        dist.broadcast(ref, src=world - 1)
        assert torch.equal(ref, before), 'compute_values differs between ranks'
    if rank == world - 1:
        with open(a.json, 'w') as f:
            json.dump({'tp': a.tp, 'pp': a.pp, 'mbs': a.micro_batch_size, 'dtype': a.dtype,
                       'values_before': before.tolist(), 'values_after': after.tolist(), 'metrics': metrics}, f)
        series = {k: [round(m.get(k, 0.0), 5) for m in metrics]
                  for k in ('value_loss', 'explained_variance', 'grad_norm')}
        print(f'ENGINE_RUN tp={a.tp} pp={a.pp} mbs={a.micro_batch_size} per update: {series}', flush=True)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def compare(paths, vtol, ltol):
    runs = []
    for p in paths:
        with open(p) as f:
            runs.append(json.load(f))
    ref = runs[0]
    ok_all = True
    for r in runs[1:]:
        d_before = (torch.tensor(r['values_before']) - torch.tensor(ref['values_before'])).abs().max().item()
        d_after = (torch.tensor(r['values_after']) - torch.tensor(ref['values_after'])).abs().max().item()
        scale = torch.tensor(ref['values_before']).abs().max().item()
        l0, l1 = ref['metrics'][0]['value_loss'], r['metrics'][0]['value_loss']
        rel_loss = abs(l1 - l0) / max(abs(l0), 1e-12)
        ok = d_before <= vtol * max(scale, 1) and rel_loss <= ltol
        ok_all &= ok
        print(f'ENGINE tp={r["tp"]} pp={r["pp"]} mbs={r["mbs"]} vs tp={ref["tp"]} pp={ref["pp"]} mbs={ref["mbs"]} '
              f'({r["dtype"]}): compute_values max|d|={d_before:.3g} (|v|max {scale:.3g}, tol {vtol}*max(|v|,1)); '
              f'step-1 value_loss {l1:.6g} vs {l0:.6g} rel {rel_loss:.2g} (tol {ltol}); values after '
              f'{len(r["metrics"])} updates max|d|={d_after:.3g}; value_loss '
              f'{[round(m["value_loss"], 4) for m in r["metrics"]]} -> {"OK" if ok else "FAIL"}')
    losses = [m['value_loss'] for m in ref['metrics']]
    falling = losses[-1] < losses[0]
    verdict = 'falling' if falling else 'NOT falling'
    print(f'ENGINE 1-GPU updates: value_loss {[round(x, 5) for x in losses]} -> {verdict}')
    return ok_all and falling


def _logs(path):
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
    from harness.cli import parse_logs  # plain parsing, nothing of the CPU harness is installed
    with open(path, errors='replace') as f:
        return [d for d in parse_logs(f.read()) if 'value_loss' in d]


def curve(name, path, min_drop=0.7):
    logs = _logs(path)
    if not logs:
        print(f'CURVE {name}: no training logs in {path}')
        return False
    vl = [d['value_loss'] for d in logs]
    k = min(5, max(1, len(vl) // 4))
    first, last = sum(vl[:k]) / k, sum(vl[-k:]) / k
    falling = last < min_drop * first
    extra = f' clipfrac first/last {logs[0]["value_clipfrac"]:.3f}/{logs[-1]["value_clipfrac"]:.3f}' \
        if 'value_clipfrac' in logs[0] else ''
    print(f'CURVE {name}: steps={len(vl)} value_loss first={vl[0]:.4f} last={vl[-1]:.4f} mean(first {k})={first:.4f} '
          f'mean(last {k})={last:.4f} -> {"falling" if falling else "NOT falling"} (< {min_drop} x); '
          f'explained_variance first='
          f'{logs[0]["explained_variance"]:.4f} last={logs[-1]["explained_variance"]:.4f}; value_mean first='
          f'{logs[0]["value_mean"]:.4f} last={logs[-1]["value_mean"]:.4f}; returns_mean last='
          f'{logs[-1]["returns_mean"]:.4f}{extra}')
    return falling


def resume(name, full_path, resumed_path, tol):
    full = {d['iteration']: d for d in _logs(full_path)}
    resumed = _logs(resumed_path)
    if not resumed:
        print(f'RESUME {name}: no training logs in {resumed_path}')
        return False
    first = resumed[0]
    ref = full.get(first['iteration'])
    common = [d for d in resumed if d['iteration'] in full]
    rel = max(abs(d['value_loss'] - full[d['iteration']]['value_loss']) / max(abs(full[d['iteration']]['value_loss']),
                                                                             1e-12) for d in common) if common else 1e9
    head_loaded = abs(first['value_mean']) > 1e-3  # a fresh (zero) head would give value_mean 0 at the first step
    ok = ref is not None and rel <= tol and head_loaded
    print(f'RESUME {name}: resumed at iteration {first["iteration"]} (value_mean {first["value_mean"]:.4f}, '
          f'{"head loaded" if head_loaded else "head NOT loaded"}); {len(common)} common steps, max rel diff of '
          f'value_loss vs the uninterrupted run {rel:.3g} (tol {tol}); first step {first["value_loss"]:.5f} vs '
          f'{ref["value_loss"] if ref else float("nan"):.5f} -> {"OK" if ok else "FAIL"}')
    return ok


def cp_match(name, ref_path, cp_path, ltol, min_drop):
    """``megatron sft`` with --context_parallel_size 2 vs the same run on 1 GPU (same data, seed, start): step-1
    value_loss within ltol (relative; bf16), and the CP run's value loss falling (``curve``)."""
    ref, cp = _logs(ref_path), _logs(cp_path)
    if not ref or not cp:
        print(f'CP {name}: no training logs in {ref_path if not ref else cp_path} -> FAIL')
        return False
    a, b = ref[0]['value_loss'], cp[0]['value_loss']
    rel = abs(b - a) / max(abs(a), 1e-12)
    n = min(len(ref), len(cp), 5)
    rel5 = max(abs(cp[i]['value_loss'] - ref[i]['value_loss']) / max(abs(ref[i]['value_loss']), 1e-12)
               for i in range(n))
    falling = curve(f'{name} (CP=2)', cp_path, min_drop)
    ok = rel <= ltol and falling and len(cp) == len(ref)
    print(f'CP {name}: step-1 value_loss CP=2 {b:.5f} vs 1 GPU {a:.5f} rel {rel:.3g} (tol {ltol}); value_mean '
          f'{cp[0]["value_mean"]:.4f} vs {ref[0]["value_mean"]:.4f}, explained_variance '
          f'{cp[0]["explained_variance"]:.4f} vs {ref[0]["explained_variance"]:.4f}; max rel diff of value_loss over '
          f'the first {n} steps {rel5:.3g} (info); steps {len(cp)}/{len(ref)}; last value_loss {cp[-1]["value_loss"]:.4f}'
          f' vs {ref[-1]["value_loss"]:.4f} -> {"OK" if ok else "FAIL"}')
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--model')
    ap.add_argument('--tp', type=int, default=1)
    ap.add_argument('--pp', type=int, default=1)
    ap.add_argument('--micro-batch-size', type=int, default=None)
    ap.add_argument('--dtype', default='bf16', choices=['bf16', 'fp32'])
    ap.add_argument('--json')
    ap.add_argument('--port', type=int, default=29631)
    ap.add_argument('--mg-kwargs', default='{}')
    ap.add_argument('--compare', nargs='+')
    ap.add_argument('--curve', nargs=2, metavar=('NAME', 'LOG'))
    ap.add_argument('--resume', nargs=3, metavar=('NAME', 'FULL_LOG', 'RESUMED_LOG'))
    ap.add_argument('--cp', nargs=3, metavar=('NAME', 'REF_LOG', 'CP_LOG'))
    ap.add_argument('--rtol', type=float, default=5e-2)
    ap.add_argument('--min-drop', type=float, default=0.7, help='--curve: falling = mean(last) < this x mean(first)')
    ap.add_argument('--vtol', type=float, default=3e-2)  # bf16: values ~O(1), a few bf16 ulps through 2+ layers
    ap.add_argument('--ltol', type=float, default=2e-2)
    a = ap.parse_args()
    if a.compare:
        raise SystemExit(0 if compare(a.compare, a.vtol, a.ltol) else 1)
    if a.curve:
        raise SystemExit(0 if curve(*a.curve, a.min_drop) else 1)
    if a.cp:
        raise SystemExit(0 if cp_match(*a.cp, a.ltol, a.min_drop) else 1)
    if a.resume:
        raise SystemExit(0 if resume(*a.resume, a.rtol) else 1)
    run(a)


if __name__ == '__main__':
    main()
