"""``MegatronCritic``'s padded and packed (THD) paths on the same weights, for the engine tests of every layout."""
import torch

# packed vs padded, fp32: values (x max(1, |v|max)), loss (relative), gradients (relative L2, worst parameter)
VTOL, LTOL, GTOL = 1e-6, 1e-6, 1e-6


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def packed_vs_padded(models, optimizer, batch, mbs, max_tokens, clip_range=None):
    """compute_values and one forward/backward (gradients finalized as megatron's schedule does, no step) of the
    padded path, the packed path (the same micro-batches) and the packed path grouped by ``max_tokens``. Returns each
    path's ``values`` and ``loss`` (value_loss, last pipeline stage; None elsewhere) and, for the packed paths,
    ``grad_rel``: the worst relative gradient difference to the padded path over this rank's parameters."""
    from swift_plt.critic.engine import MegatronCritic
    paths = {'padded': dict(remove_padding=False, micro_batch_size=mbs), 'packed': dict(micro_batch_size=mbs),
             'tokens': dict(max_tokens_per_micro_batch=max_tokens)}
    out, grads = {}, {}
    for name, kw in paths.items():
        critic = MegatronCritic(models, optimizer, clip_range=clip_range, **kw)
        values = critic.compute_values({k: batch[k] for k in ('input_ids', 'attention_mask')})
        for m in models:
            m.train()
        critic.zero_grad()
        res = critic.forward_backward_step(batch, forward_only=False)
        loss = float(sum(r['loss'] for r in res) / sum(r['sum_n'] for r in res)) if res else None
        grads[name] = {f'{i}.{n}': p.main_grad.clone() for i, m in enumerate(models) for n, p in m.named_parameters()}
        out[name] = {'values': values, 'loss': loss}
    critic.zero_grad()
    ref = grads['padded']
    for name in ('packed', 'tokens'):
        out[name]['grad_rel'] = max(_rel(grads[name][n], ref[n]) for n in ref if ref[n].norm() > 0)
    return out


def assert_packed_equals_padded(paths, what):
    """The packed paths (the padded path's micro-batches, and micro-batches by tokens) == the padded path."""
    ref = paths['padded']
    scale = max(1.0, float(ref['values'].abs().max()))
    for name in ('packed', 'tokens'):
        got = paths[name]
        dv = float((got['values'] - ref['values']).abs().max())
        dl = None if ref['loss'] is None else abs(got['loss'] - ref['loss']) / abs(ref['loss'])
        print(f'{what} {name} vs padded: values max|d| {dv:.2e} (|v|max {scale:.2f}), loss rel '
              f'{"-" if dl is None else f"{dl:.2e}"}, gradients worst rel {got["grad_rel"]:.2e}')
        assert dv <= VTOL * scale, f'{what} {name}: values differ from the padded path by {dv:.2e}'
        assert dl is None or dl <= LTOL, f'{what} {name}: loss {got["loss"]!r} vs padded {ref["loss"]!r}'
        assert got['grad_rel'] <= GTOL, f'{what} {name}: gradients differ from the padded path ({got["grad_rel"]:.2e})'
