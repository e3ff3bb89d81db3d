"""What the loss benchmarks (plt_loss_bench.py, fused_linear_plt_bench.py) share: timing a set of named rows, one
failing row reported without stopping the others, ratios of their figures, and where the JSON goes."""
import os


def run_rows(rows, measure_one, skip=(), after_each=None):
    """rows: key -> (description, fn); measure_one(fn) -> dict of figures. Returns key -> dict(name=description,
    **figures), or dict(name=..., error=repr) for a row that raised (e.g. out of memory at a large shape)."""
    results = {}
    for key, (name, fn) in rows.items():
        if key in skip:
            continue
        try:
            results[key] = dict(name=name, **measure_one(fn))
        except Exception as e:  # noqa: BLE001 -- reported, the other rows still run
            results[key] = dict(name=name, error=repr(e))
            print(f'[bench] {key} failed: {e!r}')
        if after_each is not None:
            after_each()
    return results


def ratio(results, a, b, field):
    """results[a][field] / results[b][field], None where either is missing, failed or zero."""
    try:
        return results[a][field] / results[b][field]
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def fmt(v, spec='.3f'):
    return 'n/a' if v is None else format(v, spec)


def json_path(arg, name):
    """--json if given, else $OUT/name when $OUT is set (device calls), else None."""
    return arg or (os.path.join(os.environ['OUT'], name) if os.environ.get('OUT') else None)
