"""bench/serve.py's baseline: serve.py's own server code and batching (inference/server.py,
scheduler.py) in front of the same weights exported to CTranslate2, so that a comparison
measures the engines and not the HTTP stacks.

  python bench/serve_ctranslate2.py --workdir W --port 8081 --beam_size 4

Only POST /v1/translate (plain translations) is served; scores, n-best and prefixes answer
500. Needs bench/requirements.txt (ctranslate2).
"""

import dataclasses
import os
import signal
import tempfile
from typing import Optional, Sequence

from absl import app, flags

from transformer_nmt.config import DECODE, DecodeConfig
from transformer_nmt.inference.loading import LoadedModel

_WORKDIR = flags.DEFINE_string('workdir', None, 'Trained workdir.', required=True)
_PORT = flags.DEFINE_integer('port', 8081, 'Port on 127.0.0.1.')
_BEAM = flags.DEFINE_integer('beam_size', DECODE.beam_size, 'Beam size.')
_MAX_WAIT = flags.DEFINE_float('max_wait_ms', 5.0, "serve.py's --max_wait_ms.")
_BATCHING = flags.DEFINE_bool('batch_across_requests', True,
                              "serve.py's --batch_across_requests.")
_IN_FLIGHT = flags.DEFINE_integer('batches_in_flight', 2, "serve.py's --batches_in_flight; "
                                  "CTranslate2 runs that many batches at once "
                                  '(inter_threads), the cores shared between them.')
_COMPUTE = flags.DEFINE_string('compute_type', 'float32', "CTranslate2's compute type "
                               '(float32: the same arithmetic as ours).')


class CTranslate2Engine:
  """What serve.py's server calls of an Engine (`translate`, `model`, `decode`, `n_best`,
  `store`), answered by CTranslate2 with the run's search settings: beam size, alpha and
  the output limit of input length + decode.max_extra_len (CTranslate2 takes one limit per
  call: the batch's longest input's). `in_flight` batches run at once, each on its share of
  the cores (CTranslate2's inter_threads and intra_threads)."""

  def __init__(self, model: LoadedModel, decode: DecodeConfig, directory: str,
               compute_type: str, in_flight: int):
    import ctranslate2
    self.model, self.decode, self.n_best, self.store = model, decode, 1, None
    cores = os.cpu_count() or 1
    self._translator = ctranslate2.Translator(
        directory, device='cpu', inter_threads=in_flight,
        intra_threads=max(1, cores // in_flight), compute_type=compute_type)
    tgt = model.tgt_tok
    self._ids = {p: i for i, p in enumerate(tgt.pieces(range(tgt.vocab_size)))}

  def translate(self, lines: Sequence[str], prefixes: Optional[Sequence[str]] = None
                ) -> list[str]:
    if prefixes is not None:
      raise NotImplementedError('prefixes are not part of this baseline')
    src = self.model.src_tok
    pieces = [src.pieces(ids + [src.eos_id]) for ids in src.encode(list(lines))]
    results = self._translator.translate_batch(
        pieces, beam_size=self.decode.beam_size, length_penalty=self.decode.alpha,
        max_batch_size=self.decode.tokens_per_batch, batch_type='tokens',
        max_decoding_length=max(map(len, pieces)) + self.decode.max_extra_len)
    ids = [[self._ids[p] for p in r.hypotheses[0]] for r in results]
    return self.model.tgt_tok.decode(ids)


def main(argv: Sequence[str]) -> None:
  del argv
  import uvicorn

  from transformer_nmt.export import export
  from transformer_nmt.inference import load_workdir
  from transformer_nmt.inference.server import make_app
  model = load_workdir(_WORKDIR.value)
  decode = dataclasses.replace(model.decode, beam_size=_BEAM.value).validate()
  with tempfile.TemporaryDirectory(prefix='serve_ct2_') as directory:
    export(model.cfg, model.params, model.src_tok, model.tgt_tok, directory)
    engine = CTranslate2Engine(model, decode, directory, _COMPUTE.value, _IN_FLIGHT.value)
    warm = lambda: engine.translate(['a'] * 8)  # noqa: E731 -- its first call allocates
    server = make_app(engine, max_wait_ms=_MAX_WAIT.value, mix_requests=_BATCHING.value,
                      batches_in_flight=_IN_FLIGHT.value, warm=warm)
    print(f'CTranslate2 ({_COMPUTE.value}) on http://127.0.0.1:{_PORT.value}', flush=True)
    signal.signal(signal.SIGTERM, lambda *_: None)  # as serve.py: exit 0 after uvicorn's stop
    uvicorn.run(server, host='127.0.0.1', port=_PORT.value, log_level='warning')


if __name__ == '__main__':
  app.run(main)
