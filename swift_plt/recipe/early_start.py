"""Stage 2 started beside stage 1: its process imports, parses and encodes its data while stage 1 trains, and waits,
before it builds its model, for the recipe's word that stage 1 is done (its final checkpoint written, its GPUs free).
The wait runs inside `megatron pt` (plugin/patches: ``MegatronSft.prepare_trainer``)."""
import json
import os
import sys
import time
from typing import Optional

STAGE2_START = ('early', 'after')  # --stage2_start; the first is the default
GATE_ENV = 'SWIFT_PLT_STAGE2_GATE'  # the file the recipe writes when stage 1 is done (ok) or failed
PARENT_ENV = 'SWIFT_PLT_STAGE2_GATE_PID'  # the recipe's pid: gone -> stop waiting
GATE_OPEN = '[swift-plt] stage 1 is done: building the model'  # a milestone of the stage's log (phases.py)
POLL_S = 0.5


def write_gate(path: str, ok: bool, why: str = '') -> None:
    """Tell a waiting stage 2 to go on (``ok``) or to stop (``why``), atomically."""
    tmp = f'{path}.{os.getpid()}.tmp'
    with open(tmp, 'w', encoding='utf-8') as f:
        json.dump({'ok': ok, 'why': why}, f)
    os.replace(tmp, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_gate(path: str) -> Optional[dict]:
    try:
        with open(path, encoding='utf-8') as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def wait_for_gate(environ=os.environ) -> None:
    """In a stage started early (``GATE_ENV`` set): block until the recipe opens the gate; SystemExit when it says
    stage 1 failed or the recipe is gone. Nothing otherwise."""
    path = environ.get(GATE_ENV)
    if not path:
        return
    parent = int(environ.get(PARENT_ENV, '0') or 0)
    print('[swift-plt] data ready; waiting for stage 1 to finish before building the model', flush=True)
    while True:
        word = read_gate(path)
        if word is not None:
            if not word.get('ok'):
                print(f'[swift-plt] stage 1 did not finish: {word.get("why") or "see its log"}; stage 2 stops',
                      file=sys.stderr, flush=True)
                raise SystemExit(3)
            print(GATE_OPEN, flush=True)
            return
        if parent and not _alive(parent):
            print(f'[swift-plt] the recipe (pid {parent}) that started this stage early is gone; stage 2 stops',
                  file=sys.stderr, flush=True)
            raise SystemExit(3)
        time.sleep(POLL_S)
