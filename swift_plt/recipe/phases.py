"""Where a stage's wall clock goes: the seconds at which a `megatron pt` log reaches ms-swift's start-up milestones
(verified against ms-swift 4.6's log lines; a milestone upstream stops printing is left out of the report)."""
import re
import time
from typing import Dict, List, Tuple

from swift_plt.recipe.early_start import GATE_OPEN

# (milestone, the log line that marks it), in the order a run reaches them
MILESTONES: Tuple[Tuple[str, 're.Pattern'], ...] = (
    ('args', re.compile(r'\] args: \w*Arguments\(')),  # launched, imported, arguments parsed
    ('data', re.compile(r'\] Dataset Token Length: ')),  # the train set encoded (and packed)
    ('gate', re.compile(re.escape(GATE_OPEN))),  # started beside stage 1: done waiting for it (early_start.py)
    ('model', re.compile(r'\] model_parameter_info: ')),  # the model built, HF weights loaded
    ('train', re.compile(r'\] The training of Epoch ')),  # checkpoint loaded, trainer ready
    ('step', re.compile(r"^\{'loss': ")),  # a logged training step (first and last kept)
)

# (phase, the milestone it ends at), in order: each runs from the previous milestone seen (the first from the launch);
# the first logged step is step 1 with --logging_steps 1
PHASES = (('start-up', 'args'), ('data', 'data'), ('wait', 'gate'), ('model', 'model'), ('load', 'train'),
          ('first logged step', 'first_step'), ('steps', 'last_step'), ('save and exit', 'end'))
OPTIONAL = ('gate', )


class MilestoneClock:
    """Feed it a run's output lines as they come (``line``); ``marks()``: seconds since it was made at which each
    milestone was first seen (the step: first and last), and 'end' once ``stop()`` is called."""

    def __init__(self, clock=time.monotonic):
        self._clock, self._t0, self._marks = clock, clock(), {}

    def line(self, text: str) -> None:
        for name, pattern in MILESTONES:
            if pattern.search(text):
                t = round(self._clock() - self._t0, 3)
                if name == 'step':
                    self._marks.setdefault('first_step', t)
                    self._marks['last_step'] = t
                else:
                    self._marks.setdefault(name, t)

    def stop(self) -> None:
        self._marks['end'] = round(self._clock() - self._t0, 3)

    def marks(self) -> Dict[str, float]:
        return dict(self._marks)


def phase_seconds(marks: Dict[str, float]) -> List[Tuple[str, float]]:
    """(phase, seconds) between consecutive milestones that were seen; a missing milestone joins its phase to the
    next ('data + model'), except the optional wait (a stage started early)."""
    marks = dict(marks, launch=0.0)
    out, since, names = [], 'launch', []
    for name, to in PHASES:
        if to in OPTIONAL and to not in marks:
            continue
        names.append(name)
        if to in marks and marks[to] >= marks[since]:
            out.append((' + '.join(names), round(marks[to] - marks[since], 3)))
            since, names = to, []
    return out
