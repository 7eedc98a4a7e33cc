"""bench/serve.py's baseline: serve.py's server code and batching (`make_app`) in front of the
same weights exported to CTranslate2, so that a comparison measures the engines and not the
HTTP stacks.

  python bench/serve_ctranslate2.py --workdir W --port 8081 --beam_size 4

The engine is the project's `Engine` with its one method that plain translations call,
`translate`, answered by CTranslate2; scores, n-best lists and prefixes are not part of this
baseline and answer 500. Needs ctranslate2 (requirements.txt).
"""

import dataclasses
import os
import signal
import tempfile
from typing import Optional, Sequence

import common
from absl import app, flags

from transformer_nmt import DecodeConfig, Engine, load_workdir
from transformer_nmt.inference import LoadedModel
from transformer_nmt.serving import make_app

_WORKDIR = flags.DEFINE_string('workdir', None, 'Trained workdir.', required=True)
_PORT = flags.DEFINE_integer('port', 8081, 'Port on 127.0.0.1.')
_BEAM = flags.DEFINE_integer('beam_size', DecodeConfig().beam_size, 'Beam size.')
_MAX_WAIT = flags.DEFINE_float('max_wait_ms', 5.0, "serve.py's --max_wait_ms.")
_BATCHING = flags.DEFINE_bool('batch_across_requests', True,
                              "serve.py's --batch_across_requests.")
_IN_FLIGHT = flags.DEFINE_integer('batches_in_flight', 2, "serve.py's --batches_in_flight; "
                                  "CTranslate2 runs that many batches at once "
                                  '(inter_threads), the cores shared between them.')
_COMPUTE = flags.DEFINE_string('compute_type', 'float32', "CTranslate2's compute type "
                               '(float32: the same arithmetic as ours; int8: its fastest on a '
                               'CPU).')


class CTranslate2Engine(Engine):
  """An Engine whose translations come from CTranslate2, with the run's search settings: beam
  size, alpha and the output limit of input length + decode.max_extra_len (CTranslate2 takes
  one limit per call: the batch's longest input's). `in_flight` batches run at once, each on
  its share of the cores (CTranslate2's inter_threads and intra_threads)."""

  def __init__(self, model: LoadedModel, decode: DecodeConfig, directory: str,
               compute_type: str, in_flight: int):
    import ctranslate2
    super().__init__(model, decode)
    cores = os.cpu_count() or 1
    self.translator = ctranslate2.Translator(
        directory, device='cpu', inter_threads=in_flight,
        intra_threads=max(1, cores // in_flight), compute_type=compute_type)
    tgt = model.tgt_tok
    self.target_ids = {p: i for i, p in enumerate(tgt.pieces(range(tgt.vocab_size)))}

  def translate(self, lines: Sequence[str], progress=None,
                prefixes: Optional[Sequence[str]] = None) -> list[str]:
    if prefixes is not None:
      raise NotImplementedError('prefixes are not part of this baseline')
    src = self.model.src_tok
    pieces = [src.pieces(ids + [src.eos_id]) for ids in src.encode(list(lines))]
    results = self.translator.translate_batch(
        pieces, beam_size=self.decode.beam_size, length_penalty=self.decode.alpha,
        max_batch_size=self.decode.tokens_per_batch, batch_type='tokens',
        max_decoding_length=max(map(len, pieces), default=1) + self.decode.max_extra_len)
    ids = [[self.target_ids[p] for p in r.hypotheses[0]] for r in results]
    return self.model.tgt_tok.decode(ids)

  def hypotheses(self, *args, **kwargs):
    raise NotImplementedError('n-best lists and scores are not part of this baseline')

  def score(self, *args, **kwargs):
    raise NotImplementedError('scores are not part of this baseline')


def main(argv: Sequence[str]) -> None:
  del argv
  import uvicorn
  model = load_workdir(_WORKDIR.value)
  decode = dataclasses.replace(model.decode, beam_size=_BEAM.value)
  with tempfile.TemporaryDirectory(prefix='serve_ct2_') as directory:
    common.export_ctranslate2(_WORKDIR.value, directory)
    engine = CTranslate2Engine(model, decode, directory, _COMPUTE.value, _IN_FLIGHT.value)
    warm = lambda: engine.translate(['a'] * 8)  # its first call allocates
    server = make_app(engine, max_wait_ms=_MAX_WAIT.value, mix_requests=_BATCHING.value,
                      batches_in_flight=_IN_FLIGHT.value, warm=warm)
    print(f'CTranslate2 ({_COMPUTE.value}) on http://127.0.0.1:{_PORT.value}', flush=True)
    signal.signal(signal.SIGTERM, lambda *_: None)  # as serve.py: exit 0 after uvicorn's stop
    uvicorn.run(server, host='127.0.0.1', port=_PORT.value, log_level='warning')


if __name__ == '__main__':
  app.run(main)
