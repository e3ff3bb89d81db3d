#!/usr/bin/env python3
"""MegatronCritic on a PPO rollout batch: padded rows against padding removed (packed THD rows), one GPU.

    python3 benchmarks/critic/critic_engine_bench.py                  # Llama-3.2-1B shape, bf16, one GPU
    python3 benchmarks/critic/critic_engine_bench.py --device cpu --shape toy --rounds 1   # CPU smoke run

Model: a random-init critic of the shape (config.json only, a tiny offline tokenizer), built ms-swift's way
(MegatronArguments -> get_mcore_model -> wrap_model -> megatron Adam), the value head N(0, 1/H) so that values are
O(1). Batch: ``--rows`` rollouts (fixed seed), prompts left-padded and responses right-padded (verl's layout),
lengths log-uniform in ``--prompt`` / ``--response`` (short ones more often), returns in [-1, 1] on the response.
Variants: ``padded`` (``remove_padding=False``, ``--micro-batch-size`` rows per micro-batch), ``packed`` (the same
micro-batches, padding removed), ``packed_tokens`` (padding removed, micro-batches of at most micro-batch-size x S
tokens: the padded micro-batch's bound). First the paths are compared on the same weights (values, loss, gradient
norm: CHECK line), then rounds of one ``compute_values`` + one ``update_critic`` per variant, interleaved round after
round (the padded baseline is measured in every round). Prints per variant the median seconds, tokens/s (real
tokens: attention_mask ones, per second of compute_values + update_critic), peak memory (GPU), BENCH lines, and
writes --json (or $OUT/critic_engine_bench.json when $OUT is set).
"""
import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

sys.path.insert(0, os.path.join(REPO, 'tests', 'gpu'))
from make_family_configs import LLAMA32_1B  # noqa: E402  (meta-llama/Llama-3.2-1B config.json)

SHAPES = {  # the Llama-3.2-1B shape and a toy one
    '1b': LLAMA32_1B,
    'toy': {
        'architectures': ['LlamaForCausalLM'], 'hidden_act': 'silu', 'hidden_size': 64, 'intermediate_size': 128,
        'max_position_embeddings': 1024, 'model_type': 'llama', 'num_attention_heads': 4, 'num_hidden_layers': 2,
        'num_key_value_heads': 2, 'rms_norm_eps': 1e-05, 'rope_theta': 10000.0, 'tie_word_embeddings': False,
        'torch_dtype': 'float32', 'vocab_size': 512},
}
CPU_MG_KWARGS = {'use_cpu_initialization': True, 'attention_backend': 'unfused', 'ddp_backend': 'gloo',
                 'use_distributed_optimizer': False}  # tests/harness (cli.CPU_MEGATRON_ARGS)
# bf16 tolerances of the CHECK line (fp32 on CPU: the tests' 1e-6): packed vs padded on the same weights
TOL = {'bf16': {'values': 5e-2, 'loss': 2e-2, 'grad_norm': 2e-2}, 'fp32': {'values': 1e-5, 'loss': 1e-5,
                                                                           'grad_norm': 1e-5}}


def write_model_dir(path, shape):
    """config.json of the critic (our HF format) + a tiny offline tokenizer (the engine never tokenizes)."""
    from swift_plt.critic.keys import critic_hf_config_dict
    from swift_plt.tools.tiny import _train_tokenizer, make_tokenizer_config_portable
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, 'config.json'), 'w') as f:
        json.dump(critic_hf_config_dict(dict(SHAPES[shape])), f, indent=2)
    _train_tokenizer(512, 0, 1024).save_pretrained(path)
    make_tokenizer_config_portable(path)
    return path


def build(model_dir, dtype, mg_kwargs, lr, seed):
    """ms-swift's way (tests/gpu/critic_checks.py), random init (no weights loaded)."""
    import torch
    from swift_plt.plugin.register import register_all
    register_all()
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from swift.megatron.arguments import MegatronArguments
    from swift.megatron.model import get_mcore_model
    from swift.megatron.utils import wrap_model
    from swift.model import get_processor
    kw = dict(model=model_dir, model_type='llama3_2_critic', torch_dtype=dtype, bf16=dtype == torch.bfloat16,
              fp16=False, padding_free=False, recompute_granularity='none', seed=seed, micro_batch_size=1,
              global_batch_size=1, finetune=True, no_save_optim=True, no_save_rng=True, no_load_optim=True,
              no_load_rng=True, perform_initialization=True,
              attention_backend='fused')  # as critic_checks: ms-swift's default (flash) needs the flash-attn package
    kw.update(mg_kwargs)
    args = MegatronArguments(**kw)
    hf_config = get_processor(model_dir, model_type='llama3_2_critic').model_info.config
    models = get_mcore_model(args, hf_config)
    g = torch.Generator().manual_seed(seed)
    for m in models:  # the critic's head starts at zero (swift_plt.critic.model): values O(1) instead
        if m.post_process:
            w = m.output_layer.weight
            w.data.copy_(torch.randn(w.shape, generator=g) / math.sqrt(w.shape[1]))
    models = wrap_model(args, models)
    opt = OptimizerConfig(optimizer='adam', lr=lr, weight_decay=0.0, clip_grad=1.0, bf16=args.bf16, fp16=False,
                          params_dtype=dtype, use_distributed_optimizer=args.use_distributed_optimizer)
    return models, get_megatron_optimizer(opt, models)


def rollout_batch(rows, prompt, response, vocab, seed):
    """verl's layout: [B, S] = left-padded prompts (up to the longest) + right-padded responses; value-aligned
    returns / value_mask on the response tokens."""
    import torch

    from swift_plt.critic.engine import response_to_values
    g = torch.Generator().manual_seed(seed)

    def lengths(lo, hi):  # log-uniform: short ones more often
        u = torch.rand(rows, generator=g)
        return torch.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))).round().long().clamp(lo, hi)

    p, r = lengths(*prompt), lengths(*response)
    P, R = int(p.max()), int(r.max())
    S = P + R
    pos = torch.arange(S)[None]
    mask = ((pos >= P - p[:, None]) & (pos < P + r[:, None])).long()
    ids = torch.randint(4, vocab, (rows, S), generator=g) * mask
    rmask = (torch.arange(R)[None] < r[:, None]).float()
    returns = (torch.rand(rows, R, generator=g) * 2 - 1) * rmask
    batch = {'input_ids': ids, 'attention_mask': mask, 'returns': response_to_values(returns, S),
             'value_mask': response_to_values(rmask, S)}
    info = {'rows': rows, 'S': S, 'prompt_max': P, 'response_max': R, 'real_tokens': int(mask.sum()),
            'padded_tokens': rows * S, 'prompt_mean': float(p.float().mean()), 'response_mean': float(r.float().mean())}
    return batch, info


def grad_norm(models):
    import torch
    sq = sum(float(p.main_grad.float().pow(2).sum()) for m in models for p in m.parameters()
             if getattr(p, 'main_grad', None) is not None)
    return math.sqrt(sq) if sq else float(torch.nan)


def check(critics, models, batch, tol):
    """The paths on the same weights: values, value loss, gradient norm (no optimizer step)."""
    res = {}
    for name, critic in critics.items():
        values = critic.compute_values({k: batch[k] for k in ('input_ids', 'attention_mask')})
        for m in models:
            m.train()
        critic.zero_grad()
        out = critic.forward_backward_step(batch, forward_only=False)
        loss = float(sum(o['loss'] for o in out) / sum(o['sum_n'] for o in out))
        res[name] = {'values': values.float(), 'loss': loss, 'grad_norm': grad_norm(models)}
        critic.zero_grad()
    ref = res['padded']
    real = (batch['attention_mask'][:, :-1] * batch['attention_mask'][:, 1:]).bool()
    scale = max(1.0, float(ref['values'][real].abs().max()))
    report, ok = {}, True
    for name in res:
        if name == 'padded':
            continue
        d = (res[name]['values'] - ref['values'])[real].abs()
        r = {'values_max_abs_diff': float(d.max()), 'values_mean_abs_diff': float(d.mean()), 'values_abs_max': scale,
             'loss': res[name]['loss'], 'loss_padded': ref['loss'],
             'loss_rel_diff': abs(res[name]['loss'] - ref['loss']) / abs(ref['loss']),
             'grad_norm': res[name]['grad_norm'], 'grad_norm_padded': ref['grad_norm'],
             'grad_norm_rel_diff': abs(res[name]['grad_norm'] - ref['grad_norm']) / ref['grad_norm']}
        r['ok'] = (r['values_max_abs_diff'] <= tol['values'] * scale and r['loss_rel_diff'] <= tol['loss']
                   and r['grad_norm_rel_diff'] <= tol['grad_norm'])
        ok &= r['ok']
        report[name] = r
        print(f'CHECK {name} vs padded (same weights): values max|d| {r["values_max_abs_diff"]:.3g} mean|d| '
              f'{r["values_mean_abs_diff"]:.3g} (|v|max {scale:.3g}, tol {tol["values"]} x max(1, |v|max)); '
              f'value_loss {r["loss"]:.6g} vs {r["loss_padded"]:.6g} rel {r["loss_rel_diff"]:.2g} (tol '
              f'{tol["loss"]}); grad norm {r["grad_norm"]:.6g} vs {r["grad_norm_padded"]:.6g} rel '
              f'{r["grad_norm_rel_diff"]:.2g} (tol {tol["grad_norm"]}) -> {"OK" if r["ok"] else "FAIL"}', flush=True)
    return report, ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--device', default='cuda', choices=['cuda', 'cpu'])
    ap.add_argument('--shape', default=None, choices=sorted(SHAPES), help='default: 1b on cuda, toy on cpu')
    ap.add_argument('--model-dir', default=None, help='where to write the config-only model dir (default: a temp dir)')
    ap.add_argument('--rows', type=int, default=None, help='rollouts in the batch (default 64; 8 on cpu)')
    ap.add_argument('--prompt', type=int, nargs=2, default=None, help='prompt lengths (default 64 1024; 8 64 on cpu)')
    ap.add_argument('--response', type=int, nargs=2, default=None,
                    help='response lengths (default 16 2048; 4 128 on cpu)')
    ap.add_argument('--micro-batch-size', type=int, default=4, help='rows per micro-batch (padded, packed)')
    ap.add_argument('--max-tokens', type=int, default=None,
                    help='packed_tokens: tokens per micro-batch (default micro-batch-size x S)')
    ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('--warmup', type=int, default=1)
    ap.add_argument('--lr', type=float, default=1e-6)
    ap.add_argument('--seed', type=int, default=42)
    ap.add_argument('--attention-backend', default=None, help='default: fused (cuda), unfused (cpu)')
    ap.add_argument('--port', type=int, default=29641)
    ap.add_argument('--json', default=None)
    a = ap.parse_args()
    cpu = a.device == 'cpu'
    shape = a.shape or ('toy' if cpu else '1b')
    rows = a.rows or (8 if cpu else 64)
    prompt = tuple(a.prompt or ((8, 64) if cpu else (64, 1024)))
    response = tuple(a.response or ((4, 128) if cpu else (16, 2048)))
    if cpu:  # the CPU harness (tests/harness): Transformer Engine / CUDA stand-ins, before ms-swift is imported
        sys.path.insert(0, os.path.join(REPO, 'tests'))
        from harness import install
        install()
    for k, v in dict(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0', LOCAL_WORLD_SIZE='1', MASTER_ADDR='127.0.0.1',
                     MASTER_PORT=str(a.port)).items():
        os.environ.setdefault(k, v)  # a world of one
    import torch

    from swift_plt.critic.engine import MegatronCritic
    dtype_name = 'fp32' if cpu else 'bf16'
    dtype = torch.float32 if cpu else torch.bfloat16
    mg_kwargs = dict(CPU_MG_KWARGS) if cpu else {}
    if a.attention_backend:
        mg_kwargs['attention_backend'] = a.attention_backend
    model_dir = write_model_dir(a.model_dir or tempfile.mkdtemp(prefix='critic_bench_'), shape)
    t0 = time.perf_counter()
    models, optimizer = build(model_dir, dtype, mg_kwargs, a.lr, a.seed)
    build_s = time.perf_counter() - t0
    n_params = sum(p.numel() for m in models for p in m.parameters())
    batch, info = rollout_batch(rows, prompt, response, SHAPES[shape]['vocab_size'], a.seed)
    device = next(models[0].parameters()).device
    batch = {k: v.to(device) for k, v in batch.items()}  # the driver's batch is on the GPU (verl)
    max_tokens = a.max_tokens or a.micro_batch_size * info['S']
    critics = {
        'padded': MegatronCritic(models, optimizer, micro_batch_size=a.micro_batch_size, remove_padding=False),
        'packed': MegatronCritic(models, optimizer, micro_batch_size=a.micro_batch_size),
        'packed_tokens': MegatronCritic(models, optimizer, max_tokens_per_micro_batch=max_tokens),
    }
    gpu = torch.cuda.get_device_name() if not cpu else 'cpu'
    print(f'critic {shape}: {n_params / 1e9:.3f} B params, {dtype_name}, {gpu}, built in {build_s:.0f} s; batch '
          f'{rows} rows, S={info["S"]} (prompt {prompt[0]}-{prompt[1]}, mean {info["prompt_mean"]:.0f}; response '
          f'{response[0]}-{response[1]}, mean {info["response_mean"]:.0f}), {info["real_tokens"]} real tokens of '
          f'{info["padded_tokens"]} ({info["real_tokens"] / info["padded_tokens"]:.1%}); micro-batch '
          f'{a.micro_batch_size} rows / packed_tokens {max_tokens} tokens', flush=True)
    checks, ok = check(critics, models, batch, TOL[dtype_name])

    def sync():
        if not cpu:
            torch.cuda.synchronize()

    def one(critic):
        """compute_values + update_critic; seconds, peak memory (GiB) and peak over the memory before."""
        sync()
        if not cpu:
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        t = time.perf_counter()
        critic.compute_values({k: batch[k] for k in ('input_ids', 'attention_mask')})
        metrics = critic.update_critic(batch)
        sync()
        dt = time.perf_counter() - t
        peak = torch.cuda.max_memory_allocated() / 2**30 if not cpu else 0.0
        over = peak - before / 2**30 if not cpu else 0.0
        return dt, peak, over, metrics

    for _ in range(a.warmup):
        for critic in critics.values():
            one(critic)
    times = {k: [] for k in critics}
    peaks = {k: [] for k in critics}
    overs = {k: [] for k in critics}
    for i in range(a.rounds):
        for name, critic in critics.items():  # interleaved: padded, packed, packed_tokens, padded, ...
            dt, peak, over, metrics = one(critic)
            times[name].append(dt)
            peaks[name].append(peak)
            overs[name].append(over)
            print(f'round {i} {name}: {dt:.3f} s, {info["real_tokens"] / dt:,.0f} tokens/s, peak {peak:.2f} GiB '
                  f'(+{over:.2f} over static), value_loss {metrics["value_loss"]:.4f}', flush=True)
    results = {}
    base = statistics.median(times['padded'])
    print(f'\n| variant | median s (min-max) | tokens/s | x padded | peak GiB | peak over static GiB |\n'
          f'| --- | ---: | ---: | ---: | ---: | ---: |')
    for name in critics:
        med = statistics.median(times[name])
        results[name] = {'seconds': times[name], 'median_s': med, 'tokens_per_s': info['real_tokens'] / med,
                         'speedup_vs_padded': base / med, 'peak_gib': max(peaks[name]),
                         'peak_over_static_gib': max(overs[name])}
        print(f'| {name} | {med:.3f} ({min(times[name]):.3f}-{max(times[name]):.3f}) | '
              f'{info["real_tokens"] / med:,.0f} | {base / med:.2f} | {max(peaks[name]):.2f} | '
              f'{max(overs[name]):.2f} |')
    for name in ('packed', 'packed_tokens'):
        worst = min(t for t in times['padded']) / max(times[name])  # the padded baseline's best round vs the worst
        print(f'BENCH {name}/padded tokens/s: {results[name]["speedup_vs_padded"]:.2f}x (medians; worst case '
              f'{worst:.2f}x), peak memory {results[name]["peak_gib"]:.2f} vs {results["padded"]["peak_gib"]:.2f} '
              f'GiB')
    rec = {'shape': shape, 'dtype': dtype_name, 'device': gpu, 'params': n_params, 'batch': info,
           'prompt': prompt, 'response': response, 'micro_batch_size': a.micro_batch_size, 'max_tokens': max_tokens,
           'rounds': a.rounds, 'warmup': a.warmup, 'attention_backend': mg_kwargs.get('attention_backend', 'fused'),
           'check': checks, 'check_ok': ok, 'results': results, 'date': time.strftime('%Y-%m-%d'),
           'torch': torch.__version__}
    path = a.json or (os.path.join(os.environ['OUT'], 'critic_engine_bench.json') if os.environ.get('OUT') else None)
    if path:
        with open(path, 'w') as f:
            json.dump(rec, f, indent=2)
        print(f'wrote {path}')
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    if not ok:
        raise SystemExit('CHECK failed: the packed path does not match the padded path within the tolerance')


if __name__ == '__main__':
    main()
