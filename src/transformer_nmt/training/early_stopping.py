"""Early stopping on validation BLEU (`train.patience`), as fairseq's --patience and Marian's
--early-stopping: training ends after `patience` evaluations in a row without a better
`eval_bleu`; the best checkpoint stays in the workdir's best/."""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Mapping


@dataclasses.dataclass
class EarlyStopping:
  """The best validation BLEU so far, where it was, and the evaluations since."""

  patience: int  # 0: never stop early
  best: float = -math.inf
  best_step: int = 0
  since: int = 0  # evaluations since the best one

  def update(self, step: int, bleu: float) -> bool:
    """Records an evaluation; True when training should stop now."""
    if bleu > self.best:
      self.best, self.best_step, self.since = bleu, step, 0
    else:
      self.since += 1
    return self.stopped

  @property
  def stopped(self) -> bool:
    return self.patience > 0 and self.since >= self.patience

  @classmethod
  def from_history(cls, patience: int, rows: Iterable[Mapping[str, float]],
                   up_to_step: int) -> EarlyStopping:
    """Replays the evaluations logged in metrics.jsonl up to `up_to_step` (a resumed run
    continues counting; a step logged twice by a resumed run counts once, its last row)."""
    bleu = {int(r['step']): float(r['eval_bleu']) for r in rows
            if 'eval_bleu' in r and r['step'] <= up_to_step}
    state = cls(patience)
    for step in sorted(bleu):
      state.update(step, bleu[step])
    return state
