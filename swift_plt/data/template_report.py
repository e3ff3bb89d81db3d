"""The PLT data report of a run's data sets: documents encoded by the run's own template at K=1 and at K."""
import copy
import itertools
import os
import time

from swift_plt.data.report import (
    REPORT_FILE,
    build_report,
    check_report,
    max_docs_from_env,
    min_fraction_from_env,
    write_reports,
)


def _encode_pairs(template, rows, k):
    """(K=1 encoding, K encoding) of each row, or None where the encoder drops it (as the training loader does)."""
    for row in rows:
        try:
            template.patch_size = 1
            k1 = template.encode(copy.deepcopy(row))
            template.patch_size = k
            enc = template.encode(copy.deepcopy(row))
        except Exception:
            yield None
            continue
        finally:
            template.patch_size = k
        if isinstance(k1, list):  # --truncation_strategy split is pre-encoded; kept for safety
            yield from zip(k1, enc)
        else:
            yield k1, enc


def _sample_rows(dataset, n):
    """n rows evenly spaced over the data set (all if n is None or it has no more; a streaming one: its first n),
    whether the data set is sampled, its size if known."""
    try:
        total = len(dataset)
    except TypeError:  # streaming
        total = None
    if total is not None:
        count = total if n is None else min(n, total)
        return (dataset[i * total // count] for i in range(count)), count < total, total
    rows = iter(dataset)
    return (rows if n is None else itertools.islice(rows, n)), n is not None, None


def plt_data_report(args, template, datasets, k):
    """Print and write the report of the train/val data sets before step 1; refuse a train set with no loss."""
    from swift.utils import get_logger, is_master

    logger = get_logger()
    min_fraction = min_fraction_from_env()
    n = max_docs_from_env()
    reports = []
    start = time.perf_counter()
    for split, dataset in zip(('train', 'val'), datasets):
        if dataset is None or (split == 'val' and getattr(args, 'predict_with_generate', False)):
            continue
        rows, sampled, total = _sample_rows(dataset, n)
        rows = iter(rows)
        first = next(rows, None)
        if first is None:
            continue
        if 'input_ids' in first:  # pre-encoded (cached dataset, --truncation_strategy split): no K=1 encoding
            if is_master():
                logger.info(f'PLT data report ({split}): skipped, the data set is already encoded.')
            continue
        mode = template.mode
        template.set_mode('train')
        try:
            reports.append(build_report(split, k, _encode_pairs(template, itertools.chain([first], rows), k),
                                        sampled=sampled, total_documents=total))
        finally:
            template.set_mode(mode)
    if not reports:
        return reports
    output_dir = getattr(args, 'output_dir', None) or getattr(args, 'save', None)
    if is_master():
        for r in reports:
            logger.info(r.summary())
        if output_dir:
            path = os.path.join(output_dir, REPORT_FILE)
            write_reports(path, reports)
            logger.info(f'PLT data report written to {path} ({sum(r.documents + r.skipped for r in reports):,} '
                        f'documents encoded at K=1 and K={k} in {time.perf_counter() - start:.1f} s; '
                        'SWIFT_PLT_REPORT_DOCS bounds the count)')
    for r in reports:
        warnings = check_report(r, min_fraction)  # raises (every rank) when no train document carries a loss
        if is_master():
            for w in warnings:
                logger.warning(w)
    return reports
