"""Masked value loss of a per-token critic, and its metrics (torch only, framework-free).

All tensors here are *value-aligned*: element ``[b, t]`` belongs to the value the critic outputs at position t, i.e.
the value of the state after token t, which predicts the return of token t+1 (see ``swift_plt.critic.data``).
``mask`` is 1 where a return exists (token t+1 is a response token), 0 elsewhere; masked-out entries never
contribute, whatever their values (NaN included, also in the gradient).

Loss (as verl ``core_algos.compute_value_loss`` and TRL's PPO trainer define it):
  * without old values:  0.5 * (v - R)^2
  * PPO clipped, with old values v_old and clip range eps:
        v_clip = clamp(v, v_old - eps, v_old + eps)
        0.5 * max((v - R)^2, (v_clip - R)^2)
reduced by a token mean over the mask ("token-mean" aggregation, verl's default), or returned per token.
"""
from typing import Dict, Optional

import torch


def _fp(x: torch.Tensor) -> torch.Tensor:
    """At least fp32 (bf16/fp16 model outputs are upcast; fp64 stays fp64)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _keep(x: Optional[torch.Tensor], mask: torch.Tensor) -> Optional[torch.Tensor]:
    """``x`` where ``mask``, 0 elsewhere (so neither the value nor the gradient sees masked-out entries)."""
    return None if x is None else torch.where(mask.bool(), _fp(x), torch.zeros((), dtype=_fp(x).dtype,
                                                                               device=x.device))


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` where ``mask``; masked-out entries (even NaN/inf) contribute exactly 0."""
    return torch.where(mask.bool(), x, torch.zeros_like(x)).sum()


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over ``mask``; 0 (not NaN) when the mask is empty."""
    return masked_sum(x, mask) / mask.sum().clamp(min=1)


def value_losses(values: torch.Tensor,
                 returns: torch.Tensor,
                 old_values: Optional[torch.Tensor] = None,
                 clip_range: Optional[float] = None) -> torch.Tensor:
    """Per-element value loss (same shape as ``values``), before masking; see the module docstring."""
    if (old_values is None) != (clip_range is None):
        raise ValueError('the clipped value loss needs both old_values and clip_range (got only one of them).')
    values, returns = _fp(values), _fp(returns)
    unclipped = (values - returns)**2
    if clip_range is None:
        return 0.5 * unclipped
    if clip_range < 0:
        raise ValueError(f'clip_range must be >= 0, got {clip_range}.')
    old_values = _fp(old_values)
    clipped_values = torch.maximum(torch.minimum(values, old_values + clip_range), old_values - clip_range)
    return 0.5 * torch.maximum(unclipped, (clipped_values - returns)**2)


def value_loss(values: torch.Tensor,
               returns: torch.Tensor,
               mask: torch.Tensor,
               old_values: Optional[torch.Tensor] = None,
               clip_range: Optional[float] = None) -> torch.Tensor:
    """Token-mean masked value loss (a scalar); 0 with an empty mask (and a zero gradient)."""
    return masked_mean(masked_value_losses(values, returns, mask, old_values, clip_range), mask)


def masked_value_losses(values, returns, mask, old_values=None, clip_range=None) -> torch.Tensor:
    """Per-element value loss, exactly 0 (value and gradient) where ``mask`` is 0."""
    losses = value_losses(_keep(values, mask), _keep(returns, mask), _keep(old_values, mask), clip_range)
    return _keep(losses, mask)


def clipped_tokens(values, returns, mask, old_values, clip_range) -> torch.Tensor:
    """Bool per element: inside ``mask`` and the clipped term is the larger one (detached)."""
    values, returns, old_values = (_keep(x.detach(), mask) for x in (values, returns, old_values))
    unclipped = (values - returns)**2
    clipped = 2 * value_losses(values, returns, old_values, clip_range)
    return (clipped > unclipped) & mask.bool()


def clip_fraction(values, returns, mask, old_values, clip_range) -> torch.Tensor:
    """Fraction of masked tokens where the clipped term is the larger one (verl's ``vf_clipfrac``)."""
    return masked_mean(clipped_tokens(values, returns, mask, old_values, clip_range).float(), mask)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var[R - v] / Var[R] over the mask (population variances; the n/(n-1) factor cancels). NaN when the
    returns have no variance (e.g. one constant reward: nothing to explain)."""
    return explained_variance_from_sums(value_stats(values, returns, mask))


# Sufficient statistics, so that metrics can be summed over micro-batches and data-parallel ranks first.
STAT_KEYS = ('n', 'v', 'r', 'r2', 'd', 'd2')


def value_stats(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Masked sums (detached, fp32): n, sum v, sum R, sum R^2, sum (R - v), sum (R - v)^2."""
    values, returns = _keep(values.detach(), mask), _keep(returns.detach(), mask)
    diff = returns - values
    return {
        'n': mask.float().sum(),
        'v': masked_sum(values, mask),
        'r': masked_sum(returns, mask),
        'r2': masked_sum(returns * returns, mask),
        'd': masked_sum(diff, mask),
        'd2': masked_sum(diff * diff, mask),
    }


def explained_variance_from_sums(s: Dict[str, torch.Tensor]) -> torch.Tensor:
    n = s['n'].clamp(min=1)
    var_r = s['r2'] / n - (s['r'] / n)**2
    var_d = s['d2'] / n - (s['d'] / n)**2
    # Var[R] from sums: below ~1e-6 of E[R^2] it is rounding noise, not variance
    no_variance = var_r <= 1e-6 * (s['r2'] / n)
    return torch.where(no_variance, torch.full_like(var_r, float('nan')), 1 - var_d / var_r)


def value_metrics(values, returns, mask, old_values=None, clip_range=None) -> Dict[str, float]:
    """The logged metrics of one batch: value_loss, explained_variance, value_mean, returns_mean (+ clipfrac)."""
    with torch.no_grad():
        s = value_stats(values, returns, mask)
        n = s['n'].clamp(min=1)
        out = {
            'value_loss': float(value_loss(values, returns, mask, old_values, clip_range)),
            'explained_variance': float(explained_variance_from_sums(s)),
            'value_mean': float(s['v'] / n),
            'returns_mean': float(s['r'] / n),
        }
        if clip_range is not None:
            out['value_clipfrac'] = float(clip_fraction(values, returns, mask, old_values, clip_range))
    return out
