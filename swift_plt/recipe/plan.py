"""Budget arithmetic of the two-stage PLT recipe (pure: no torch, no ms-swift).

Given a token budget N, a patch size K, the patch-level fraction λ, the token-level sequence length T and the global
batch size G (sequences per optimizer step of the token-level stage):

  stage 1 (patch level)  λ·N tokens at sequence length K·T, G1 sequences per step:
                           stage1_batch='tokens' (default): G1 = G/K, one step consumes G·T tokens, the same as a
                             stage-2 step, so both stages take the same number of optimizer steps per token. This is
                             the paper's set-up (PatchTrain's run_patch.sh: gradient accumulation 8 at block size
                             8192 vs 32 at 2048 in run_token.sh: the same tokens per step, 90k + 45k steps vs 135k).
                           stage1_batch='sequences': G1 = G, one step consumes G·K·T tokens (K times the tokens per
                             step and 1/K the steps of the default; at small budgets this leaves stage 1 too few
                             steps: see benchmarks/quality/README.md).
  stage 2 (token level)  (1-λ)·N tokens at sequence length T; one step consumes G·T tokens

  train_iters = floor(stage tokens / tokens per step)    (rounded DOWN: never more than the budget)
  tokens actually consumed = train_iters · tokens per step (<= the stage's share)

A stage-1 sequence of K·T tokens is T model positions (patches), so the compute relative to token-level training on
the same data is λ/K + 1 - λ (the paper's figure, e.g. 0.5 for K=4, λ=2/3); the plan also reports the same ratio for
the token counts actually consumed after rounding, (n1/K + n2) / (n1 + n2) with n1, n2 the tokens of each stage.
"Tokens" are sequence slots: without `--packing`, documents shorter than the sequence length consume fewer.

λ is kept as an exact fraction (``--lam 2/3`` or ``0.6667``), so λ·N has no float rounding.
"""
import math
import re
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Union

DEFAULT_PATCH_SIZE = 4
DEFAULT_LAM = Fraction(2, 3)
STAGE1_BATCH = ('tokens', 'sequences')  # the first is the default
_SUFFIX = {'': 1, 'K': 10**3, 'M': 10**6, 'B': 10**9, 'G': 10**9, 'T': 10**12}


def parse_tokens(value: Union[int, str]) -> int:
    """Token budget: an integer, ``1e9``, or with a suffix ``K``/``M``/``B`` (or ``G``)/``T`` (powers of 1000)."""
    if isinstance(value, bool):
        raise ValueError(f'--tokens must be a positive number of tokens, got {value!r}.')
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r'\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMBGT]?)\s*', str(value), re.IGNORECASE)
        if not m:
            raise ValueError(f'--tokens {value!r}: expected an integer, 1e9, or a number with K/M/B/T (e.g. 2B).')
        n = Fraction(m.group(1)) * _SUFFIX[m.group(2).upper()]
        if n.denominator != 1:
            raise ValueError(f'--tokens {value!r} is not a whole number of tokens.')
        n = int(n)
    if n <= 0:
        raise ValueError(f'--tokens must be a positive number of tokens, got {value!r}.')
    return n


def parse_lam(value: Union[float, str, Fraction]) -> Fraction:
    """λ as an exact fraction: ``2/3``, ``0.5`` or a float (converted exactly as written by ``repr``)."""
    try:
        lam = Fraction(value) if isinstance(value, Fraction) else Fraction(str(value).strip())
    except (ValueError, ZeroDivisionError):
        raise ValueError(f'--lam {value!r}: expected a fraction like 2/3 or a decimal like 0.667.') from None
    if not 0 < lam < 1:
        raise ValueError(f'--lam {value} is outside (0, 1): λ is the fraction of the token budget trained at patch '
                         'level (the rest is token level); the paper uses 2/3. λ=0 is ordinary training (use '
                         '`megatron pt`), λ=1 leaves no token-level stage and so no usable model.')
    return lam


@dataclass(frozen=True)
class StagePlan:
    name: str  # 'patch' or 'token'
    patch_size: int
    seq_length: int  # tokens per sequence (--max_length of the stage)
    global_batch_size: int  # sequences per optimizer step (--global_batch_size of the stage)
    budget_tokens: int  # this stage's share of N
    tokens_per_step: int
    train_iters: int
    tokens: int  # consumed: train_iters * tokens_per_step


@dataclass(frozen=True)
class TwoStagePlan:
    tokens: int  # N
    patch_size: int  # K
    lam: Fraction  # λ
    seq_length: int  # T
    global_batch_size: int  # G (the token-level stage)
    stage1_batch: str  # 'tokens': stage 1 takes G/K sequences per step; 'sequences': G
    stage1: StagePlan
    stage2: StagePlan

    @property
    def nominal_compute_ratio(self) -> Fraction:
        """λ/K + 1 − λ: compute relative to token-level training on N tokens (the paper's figure)."""
        return self.lam / self.patch_size + 1 - self.lam

    @property
    def actual_compute_ratio(self) -> Fraction:
        """The same for the tokens actually consumed: model positions run / tokens (= positions of token-level
        training on the same tokens)."""
        n1, n2 = self.stage1.tokens, self.stage2.tokens
        return Fraction(n1, self.patch_size) / (n1 + n2) + Fraction(n2, n1 + n2)

    @property
    def consumed_tokens(self) -> int:
        return self.stage1.tokens + self.stage2.tokens

    def to_dict(self) -> dict:
        d = asdict(self)
        d['lam'] = str(self.lam)
        return d

    def summary(self) -> str:
        s1, s2 = self.stage1, self.stage2
        lines = [
            f'Two-stage PLT plan: N={self.tokens:,} tokens, K={self.patch_size}, λ={self.lam} '
            f'({float(self.lam):.4f}), T={self.seq_length}, global_batch_size={self.global_batch_size}, '
            f'stage1_batch={self.stage1_batch}',
        ]
        for i, s in ((1, s1), (2, s2)):
            lines.append(f'  stage {i} ({s.name} level, patch_size={s.patch_size}, max_length={s.seq_length}, '
                         f'global_batch_size={s.global_batch_size}): budget {s.budget_tokens:,} tokens / '
                         f'{s.tokens_per_step:,} per step -> train_iters '
                         f'{s.train_iters:,} (rounded down), {s.tokens:,} tokens consumed')
        lines.append(f'  total: {self.consumed_tokens:,} of {self.tokens:,} tokens consumed '
                     f'({self.tokens - self.consumed_tokens:,} left by rounding)')
        lines.append(f'  compute vs token-level training: λ/K + 1 - λ = {float(self.nominal_compute_ratio):.4f} '
                     f'(FLOP saving {1 - float(self.nominal_compute_ratio):.1%}); after rounding '
                     f'{float(self.actual_compute_ratio):.4f}')
        return '\n'.join(lines)


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'--{name} must be a positive integer, got {value!r}.')
    return value


def stage1_global_batch_size(global_batch_size: int, patch_size: int, stage1_batch: str = STAGE1_BATCH[0]) -> int:
    """Sequences (of K·T tokens) per stage-1 step; ValueError (what to do) when G/K is not whole."""
    if stage1_batch not in STAGE1_BATCH:
        raise ValueError(f'--stage1_batch {stage1_batch!r}: use one of {", ".join(STAGE1_BATCH)}.')
    if stage1_batch == 'sequences':
        return global_batch_size
    if global_batch_size % patch_size:
        raise ValueError(f'--global_batch_size {global_batch_size} is not a multiple of --patch_size {patch_size}: '
                         f'stage 1 takes G/K sequences of K·T tokens per step (the same tokens per step as stage 2, '
                         f'as in the paper). Use a multiple of {patch_size} (e.g. '
                         f'{max(patch_size, global_batch_size // patch_size * patch_size)}), or --stage1_batch '
                         'sequences (G sequences per stage-1 step: K times the tokens per step, 1/K the steps).')
    return global_batch_size // patch_size


def min_tokens(patch_size: int, lam: Fraction, seq_length: int, global_batch_size: int,
               stage1_batch: str = STAGE1_BATCH[0]) -> int:
    """Smallest N for which both stages get at least one step. Both shares, floor(λ·N) and N - floor(λ·N) =
    ceil((1-λ)·N), grow with N, so the condition is monotone: binary search."""
    step1 = stage1_global_batch_size(global_batch_size, patch_size, stage1_batch) * patch_size * seq_length
    step2 = global_batch_size * seq_length

    def enough(n):
        share1 = math.floor(lam * n)
        return share1 >= step1 and n - share1 >= step2

    lo, hi = 1, math.ceil(step1 / lam) + math.ceil(step2 / (1 - lam))  # hi is enough
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid + 1, hi)
    return lo


def make_plan(tokens, patch_size: int = DEFAULT_PATCH_SIZE, lam=DEFAULT_LAM, *, seq_length: int,
              global_batch_size: int, stage1_batch: str = STAGE1_BATCH[0]) -> TwoStagePlan:
    """The two-stage plan; ValueError (what is wrong, what to do) for bad input or a budget below one step."""
    n = parse_tokens(tokens)
    lam = parse_lam(lam)
    _positive_int('patch_size', patch_size)
    if patch_size < 2:
        raise ValueError(f'--patch_size {patch_size}: the two-stage recipe needs K >= 2 (K=1 has no patch-level '
                         'stage; for ordinary training use `megatron pt`).')
    _positive_int('max_length', seq_length)
    _positive_int('global_batch_size', global_batch_size)
    g1 = stage1_global_batch_size(global_batch_size, patch_size, stage1_batch)
    budget1 = math.floor(lam * n)  # exact: lam is a Fraction
    budget2 = n - budget1
    stages = []
    for name, k, g, budget in (('patch', patch_size, g1, budget1), ('token', 1, global_batch_size, budget2)):
        per_step = g * k * seq_length
        iters = budget // per_step
        stages.append(StagePlan(name, k, k * seq_length, g, budget, per_step, iters, iters * per_step))
    short = [s for s in stages if s.train_iters < 1]
    if short:
        what = '; '.join(f'stage {stages.index(s) + 1} ({s.name} level) gets {s.budget_tokens:,} tokens but one step '
                         f'needs {s.tokens_per_step:,} (global_batch_size {s.global_batch_size} x max_length '
                         f'{s.seq_length})' for s in short)
        raise ValueError(f'--tokens {n:,} is too small for one training step: {what}. Use --tokens >= '
                         f'{min_tokens(patch_size, lam, seq_length, global_batch_size, stage1_batch):,}, or a '
                         'smaller --global_batch_size / --max_length.')
    return TwoStagePlan(n, patch_size, lam, seq_length, global_batch_size, stage1_batch, *stages)
