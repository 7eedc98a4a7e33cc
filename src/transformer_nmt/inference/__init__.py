"""The inference engine: what serves translations of a trained model.

`Engine` is its one public class (engine.py): a workdir's model, or an ensemble's, loaded
(loading.py: checkpoints, averaging, the moving average, snapshots.py's parameter cache)
with its search settings, translating and scoring lines in batches over fixed shape grids
(batches.py, long_lines.py), its compiled programs kept on disk (programs.py) and the C
heap trimmed between batches (heap.py). decode.py, recipe.py's selection, validation BLEU
during training call it, and a server would; decoding/ holds the pure search it runs.
`make_app` (server.py) puts an engine behind serve.py's HTTP API; it is imported when first
asked for, so that importing the package does not load the HTTP stack (FastAPI, uvicorn).
"""

from transformer_nmt.inference.engine import Engine
from transformer_nmt.inference.hypotheses import Hypothesis
from transformer_nmt.inference.loading import LoadedModel, load_ensemble, load_workdir

__all__ = ['Engine', 'Hypothesis', 'LoadedModel', 'load_ensemble', 'load_workdir', 'make_app']


def __getattr__(name: str):
  if name == 'make_app':  # about 0.6 s of imports, which decode.py and train.py do not need
    from transformer_nmt.inference.server import make_app
    return make_app
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
