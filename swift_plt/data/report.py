"""PLT data report: how much of a data set the patch stage trains on, from the same documents encoded at K=1 and at K.
Pure counts and verdicts (no torch, no ms-swift); the fields and the start-up cost are in docs/data-report.md.
"""
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Iterable, List, Optional, Sequence

from swift_plt.patch_level import IGNORE_INDEX

REPORT_FILE = 'plt_data_report.json'
MIN_FRACTION_ENV = 'SWIFT_PLT_MIN_LOSS_FRACTION'  # warn below this share of K=1's loss tokens
MAX_DOCS_ENV = 'SWIFT_PLT_REPORT_DOCS'  # documents counted per data set (0: all, also for streaming)
DEFAULT_MIN_FRACTION = 0.8
DEFAULT_MAX_DOCS = 1_000  # per data set, streaming or not: a few seconds to ~16 s of start-up


@dataclass
class DocCounts:
    tokens: int  # encoded length at K=1
    pad_tokens: int  # added by the K-level encoding
    loss_tokens_k1: int
    loss_tokens: int


def count_loss(labels: Optional[Sequence[int]], start: int = 0) -> int:
    """Labels from position ``start`` on that carry a loss (!= -100). No labels: every position does."""
    if labels is None:
        return 0
    return sum(1 for x in labels[start:] if x != IGNORE_INDEX)


def document_counts(k1_encoded: dict, encoded: dict) -> DocCounts:
    """Counts of one document from its K=1 encoding and its K-level encoding (dicts with input_ids and labels)."""
    tokens = len(k1_encoded['input_ids'])
    return DocCounts(
        tokens=tokens,
        pad_tokens=len(encoded['input_ids']) - tokens,
        loss_tokens_k1=count_loss(k1_encoded.get('labels'), 1),
        loss_tokens=count_loss(encoded.get('labels')))


def expected_counts(labels: Sequence[int], patch_size: int) -> DocCounts:
    """Counts of the PLT encoding (pad to a multiple of K, first patch masked) of a document with K=1 ``labels``:
    what ``document_counts`` must measure when nothing else pads."""
    n = len(labels)
    return DocCounts(tokens=n, pad_tokens=-n % patch_size, loss_tokens_k1=count_loss(labels, 1),
                     loss_tokens=count_loss(labels, patch_size))


@dataclass
class DataReport:
    split: str  # 'train' / 'val'
    patch_size: int
    documents: int = 0
    skipped: int = 0
    tokens: int = 0
    pad_tokens: int = 0
    loss_tokens_k1: int = 0
    loss_tokens: int = 0
    documents_without_loss: int = 0
    documents_without_loss_k1: int = 0
    sampled: bool = False  # only the first `documents + skipped` of a larger (or streaming) data set
    total_documents: Optional[int] = None  # the data set's size where known
    doc_tokens_hist: dict = field(default_factory=dict)  # 'n<=K', 'K<n<=2K', ... (documents by K=1 length)

    def add(self, c: DocCounts) -> None:
        self.documents += 1
        self.tokens += c.tokens
        self.pad_tokens += c.pad_tokens
        self.loss_tokens_k1 += c.loss_tokens_k1
        self.loss_tokens += c.loss_tokens
        self.documents_without_loss += c.loss_tokens == 0
        self.documents_without_loss_k1 += c.loss_tokens_k1 == 0
        b = length_bucket(c.tokens, self.patch_size)
        self.doc_tokens_hist[b] = self.doc_tokens_hist.get(b, 0) + 1

    @property
    def effective_fraction(self) -> Optional[float]:
        return self.loss_tokens / self.loss_tokens_k1 if self.loss_tokens_k1 else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d['effective_fraction'] = self.effective_fraction
        d['encoded_tokens'] = self.tokens + self.pad_tokens
        return d

    def summary(self) -> str:
        k = self.patch_size
        n = self.documents + self.skipped
        scope = ((f'{n:,} of {self.total_documents:,} documents, evenly spaced' if self.total_documents
                  else f'first {n:,} documents (streaming)') if self.sampled else 'all documents')
        frac = self.effective_fraction
        lines = [
            f'PLT data report ({self.split}, patch_size={k}, {scope}):',
            f'  documents: {self.documents:,}'
            + (f' (+{self.skipped:,} dropped by the encoder)' if self.skipped else ''),
            f'  tokens as encoded (K=1): {self.tokens:,}; pad tokens added at K={k}: {self.pad_tokens:,} '
            f'({_pct(self.pad_tokens, self.tokens + self.pad_tokens)} of {self.tokens + self.pad_tokens:,})',
            f'  tokens carrying a loss: {self.loss_tokens:,} at K={k} vs {self.loss_tokens_k1:,} at K=1 '
            f'(effective fraction {"n/a" if frac is None else f"{frac:.1%}"})',
            f'  documents carrying no loss: {self.documents_without_loss:,} of {self.documents:,} at K={k} '
            f'({self.documents_without_loss_k1:,} at K=1)',
            f'  documents by K=1 length: ' + ', '.join(f'{b}: {n:,}' for b, n in sorted_hist(self.doc_tokens_hist)),
        ]
        return '\n'.join(lines)


def length_bucket(n: int, k: int) -> str:
    """'<=K' (no loss at K), '<=2K', '<=4K', '<=8K', ... (powers of two times K), by tokens at K=1."""
    if n <= k:
        return f'<={k}'
    m = 2
    while n > m * k:
        m *= 2
    return f'<={m * k}'


def sorted_hist(hist: dict) -> List[tuple]:
    return sorted(hist.items(), key=lambda kv: int(kv[0][2:]))


def _pct(a: int, b: int) -> str:
    return f'{a / b:.1%}' if b else 'n/a'


def build_report(split: str, patch_size: int, pairs: Iterable[Optional[tuple]], *, sampled: bool = False,
                 total_documents: Optional[int] = None) -> DataReport:
    """``pairs``: per document (k1_encoded, encoded), or None for a document the encoder dropped."""
    report = DataReport(split, patch_size, sampled=sampled, total_documents=total_documents)
    for pair in pairs:
        if pair is None:
            report.skipped += 1
        else:
            report.add(document_counts(*pair))
    return report


# ------------------------------------------------------------------------------------------- verdicts
class NoLossDataError(ValueError):
    """No document of the data set carries a loss at patch level."""


def advice(patch_size: int) -> str:
    return (f'To train on more of it: join short documents into longer ones in the data (ms-swift\'s --packing '
            f'keeps documents apart, so every document still loses its first patch), filter out documents of '
            f'{patch_size} tokens or fewer, or lower --patch_size.')


def check_report(report: DataReport, min_fraction: float) -> List[str]:
    """Raise NoLossDataError when no counted train document (all, or an even sample) carries a loss; return the
    warnings (loss tokens below ``min_fraction`` of K=1's; a streaming train set or a val set with no loss token)."""
    k = report.patch_size
    warnings = []
    if report.documents and report.loss_tokens == 0:
        if not report.sampled:
            what = f'no document of the {report.split} data set ({report.documents:,} documents) carries'
        elif report.total_documents:
            what = (f'none of the {report.documents:,} documents counted ({MAX_DOCS_ENV}; evenly spaced over its '
                    f'{report.total_documents:,}; {MAX_DOCS_ENV}=0 counts all) of the {report.split} data set carries')
        else:
            what = f'none of the first {report.documents:,} documents of the {report.split} data set carries'
        msg = (f'PLT (patch_size={k}): {what} a loss: a document of {k} tokens or fewer has no patch that '
               f'another patch predicts (the first patch of every document is never predicted), and '
               f'{report.documents_without_loss:,} of {report.documents:,} are that short after encoding. '
               + advice(k))
        # refused before step 1 when the whole train set, or an even sample of it, has no loss token; a streaming
        # one (its first documents only) is warned about, and the step check stops the run at its first empty step
        if report.split == 'train' and (not report.sampled or report.total_documents):
            raise NoLossDataError(msg)
        warnings.append(msg)
        return warnings
    frac = report.effective_fraction
    if frac is not None and frac < min_fraction:
        short = report.documents_without_loss
        warnings.append(
            f'PLT (patch_size={k}): the patch stage trains on {frac:.1%} of the loss tokens that K=1 would '
            f'({report.loss_tokens:,} of {report.loss_tokens_k1:,}) in the {report.split} data set (threshold '
            f'{min_fraction:.0%}, {MIN_FRACTION_ENV}). Causes: every document loses its first patch ({k} tokens) '
            f'to prediction; {short:,} of {report.documents:,} documents ({_pct(short, report.documents)}) have '
            f'{k} tokens or fewer and carry no loss at all; {report.pad_tokens:,} pad tokens '
            f'({_pct(report.pad_tokens, report.tokens + report.pad_tokens)} of the encoded tokens) fill patches. '
            + advice(k))
    return warnings


def min_fraction_from_env(environ=os.environ) -> float:
    value = environ.get(MIN_FRACTION_ENV, '')
    try:
        return float(value) if value.strip() else DEFAULT_MIN_FRACTION
    except ValueError:
        raise ValueError(f'{MIN_FRACTION_ENV}={value!r}: expected a number in [0, 1] (e.g. 0.8).') from None


def max_docs_from_env(environ=os.environ) -> Optional[int]:
    """Documents counted per data set: None = all."""
    value = environ.get(MAX_DOCS_ENV, '').strip()
    if not value:
        return DEFAULT_MAX_DOCS
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f'{MAX_DOCS_ENV}={value!r}: expected a number of documents (0 = all).') from None
    return None if n <= 0 else n


def write_reports(path: str, reports: List[DataReport]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, 'w', encoding='utf-8') as f:
        json.dump({r.split: r.to_dict() for r in reports}, f, indent=2)


def read_reports(path: str) -> Optional[dict]:
    try:
        with open(path, encoding='utf-8') as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------------------- step check
def check_step_loss_tokens(count: int, patch_size: int, step: Optional[int] = None) -> None:
    """Raise when a whole optimizer step (all micro-batches, all data-parallel ranks) has no loss token at K > 1."""
    if patch_size > 1 and count == 0:
        at = f' at step {step}' if step is not None else ''
        raise RuntimeError(
            f'PLT (patch_size={patch_size}): no token of this step{at} carries a loss (every label is -100), so the '
            f'step trains nothing: every document in it has {patch_size} tokens or fewer, or no label after its first '
            f'patch (the first patch of a document is never predicted). See the PLT data report printed before '
            f'step 1. ' + advice(patch_size))


# ------------------------------------------------------------------------------------------- two-stage estimate
def estimate_loss_tokens(report: dict, patch_size: int, sequences: int, seq_length: int, packing: bool) -> int:
    """Loss tokens of ``sequences`` rows of ``seq_length`` from a report (``to_dict``; K=1 counts at ``patch_size``
    1): sequences x loss tokens per document, or with packing an upper bound, slots x loss tokens per encoded token."""
    loss = report['loss_tokens'] if patch_size > 1 else report['loss_tokens_k1']
    if packing:
        encoded = report['tokens'] + (report['pad_tokens'] if patch_size > 1 else 0)
        return sequences * seq_length * loss // encoded if encoded else 0
    return sequences * loss // report['documents'] if report['documents'] else 0
