"""The inference engine: what serves translations of a trained model.

`Engine` is its one public class (engine.py): a workdir's model, or an ensemble's, loaded
(loading.py: checkpoints, averaging, the moving average, snapshots.py's parameter cache)
with its search settings, translating and scoring lines in batches over fixed shape grids
(batches.py, long_lines.py), its compiled programs kept on disk (programs.py) and the C
heap trimmed between batches (heap.py). decode.py, recipe.py's selection, validation BLEU
during training call it, and a server would; decoding/ holds the pure search it runs.
The HTTP server (serving/) and decode.py's file job (decode_job/) are built on it.
"""

from transformer_nmt.inference.engine import Engine
from transformer_nmt.inference.hypotheses import Hypothesis
from transformer_nmt.inference.loading import (
    CheckpointChoice,
    LoadedModel,
    load_ensemble,
    load_workdir,
)

__all__ = ['CheckpointChoice', 'Engine', 'Hypothesis', 'LoadedModel', 'load_ensemble',
           'load_workdir']

