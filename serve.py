"""Serve translations over HTTP: python serve.py --workdir DIR [--port 8080]

The model, search settings, stored programs and ensembles are decode.py's (the same flags).
Sentences of concurrent requests share batches (up to --batch_tokens, waiting at most
--max_wait_ms to fill one). The API (serving/server.py, docs/decoding.md "Serving"):

  POST /v1/translate  {"text": ["Ein Hund läuft."], "n_best": 1, "return_scores": false,
                       "prefix": ["A dog"], "stream": false}
  POST /v1/score      {"source": [...], "target": [...]}
  GET  /health        ready once the programs of small batches are compiled or loaded
  GET  /metrics       Prometheus
  GET  /              a web page to try it (it asks for the API key, if there is one)
  GET  /openapi.json  the API's description (FastAPI's /docs and /redoc are off: they need
                      the internet)

It binds 127.0.0.1 unless --host says otherwise; --api_key_file guards all but /health and /.
SIGTERM (or Ctrl-C) stops accepting, finishes the requests in flight and exits 0.
"""

import pathlib
import signal

from absl import app, flags

from transformer_nmt.cli import flag_parser, main_running
from transformer_nmt.decoding.settings import DECODE, PRECOMPILE_LENGTH
from transformer_nmt.inference import options

options.define_model_flags()
options.define_decode_flags()  # each defaults to the run's own decode.* value
flags.adopt_module_key_flags(options)  # listed by --help with this program's own
flags.DEFINE_string('host', '127.0.0.1', 'Address to bind (0.0.0.0: every interface).')
flags.DEFINE_integer('port', 8080, 'Port to listen on.', lower_bound=1, upper_bound=65535)
flags.DEFINE_float('max_wait_ms', 5.0, 'Longest wait for more sentences to fill a batch after '
                   'the first arrives (0: run at once).', lower_bound=0)
flags.DEFINE_integer('batches_in_flight', 2, 'Batches run at once, each from a thread of '
                     'its own on the engine\'s decoding threads: a batch starts while the one '
                     'before decodes its last sentences (1: one after another).', lower_bound=1)
flags.DEFINE_bool('batch_across_requests', True, 'Let the sentences of concurrent requests '
                  'share batches (--nobatch_across_requests: each batch holds one request\'s).')
flags.DEFINE_integer('max_connections', 1000, 'Open connections and requests at once; more '
                     'are answered 503 with Retry-After (bounds what slow clients can hold).',
                     lower_bound=1)
flags.DEFINE_float('header_timeout_s', 10.0, 'Seconds a request head may take to arrive, from '
                   'the connection\'s start (or, kept alive, the first byte after an answer); '
                   'then 408 and the connection closes, so that slow clients cannot hold '
                   'connections.', lower_bound=0.001)
flags.DEFINE_integer('n_best', 1, 'Most hypotheses a request may ask for (at most the beam '
                     'size).', lower_bound=1)
flags.DEFINE_integer('max_chars', 2000, 'Longest sentence in characters.', lower_bound=1)
flags.DEFINE_integer('max_sentences', 256, 'Most sentences per request.', lower_bound=1)
flags.DEFINE_integer('max_body_bytes', 1 << 20, 'Largest request body (413 above).',
                     lower_bound=1)
flags.DEFINE_float('timeout_s', 60.0, 'Seconds a request may take: 504 after, and its '
                   'sentences not yet run are dropped.', lower_bound=0.001)
flags.DEFINE_integer('max_queue_sentences', 4096, 'Sentences that may wait for a batch; more '
                     'get 503 with Retry-After.', lower_bound=1)
flags.DEFINE_bool('gc_freeze', True, 'Once warm, leave the objects alive then out of garbage '
                  'collection (compiling leaves millions, which each full collection would walk '
                  'with every request stalled); --nogc_freeze: collect them as usual.')
flags.DEFINE_string('api_key_file', None, 'File holding an API key that requests must send as '
                    '"Authorization: Bearer KEY" (all but /health and the page at /, which '
                    'asks for it).')
flags.DEFINE_integer('precompile_rows', None, 'Before /health says ready: the programs '
                     '(translation, and scoring for scores, n-best and alignments) of batches '
                     'of up to this many sentences (default: as many as --batch_tokens holds, '
                     'every batch the server can form) ...', lower_bound=1)
flags.DEFINE_integer('precompile_length', PRECOMPILE_LENGTH, '... of up to this many source '
                     'subwords are compiled or loaded. Nothing is compiled after: longer '
                     'sentences are translated in pieces of this length, and a prefix or a pair '
                     'to score longer than it is answered 422.', lower_bound=1)


def run() -> None:
  import uvicorn

  from transformer_nmt.errors import DataError
  from transformer_nmt.inference.engine import Engine
  from transformer_nmt.serving.connections import connection_protocol
  from transformer_nmt.serving.server import Limits, make_app

  f, m = flags.FLAGS, options.model_options()
  limits = Limits(f.max_chars, f.max_sentences, f.max_body_bytes, f.timeout_s,
                  f.max_queue_sentences)
  try:
    limits.check()
  except ValueError as e:
    raise DataError(f'--{e}') from None
  api_key = None
  if f.api_key_file:
    try:
      api_key = pathlib.Path(f.api_key_file).read_text(encoding='utf-8').strip()
    except (OSError, UnicodeDecodeError) as e:
      raise DataError(f'--api_key_file: {e}') from None
    if not api_key:
      raise DataError(f'--api_key_file {f.api_key_file} is empty')
  overrides = options.decode_overrides()
  options.with_overrides(DECODE, overrides)  # a bad flag fails before loading
  m.limit_heaps()
  engine = Engine(m.load(overrides), n_best=f.n_best, programs=m.program_dir(),
                  concurrent_batches=m.concurrent_batches)
  rows = engine.decode.tokens_per_batch if f.precompile_rows is None else f.precompile_rows

  def warm() -> None:  # then nothing compiles while serving (Engine.seal)
    engine.precompile(rows, f.precompile_length, scoring=True, kept_only=False)
    engine.seal()
  server = make_app(engine, limits, api_key=api_key, max_wait_ms=f.max_wait_ms,
                    mix_requests=f.batch_across_requests,
                    batches_in_flight=f.batches_in_flight, warm=warm,
                    freeze_after_warm=f.gc_freeze)
  print(f'serving checkpoint step(s) {engine.model.steps} on http://{f.host}:{f.port} '
        '(ready once /health says so)', flush=True)
  # uvicorn stops gracefully on SIGTERM, then raises the signal again for the handler it
  # found: a no-op, so that a requested stop exits 0 (not 143) once in-flight requests end
  signal.signal(signal.SIGTERM, lambda *_: None)
  # our connections (serving/connections.py) bound slow heads and refuse past
  # --max_connections with our JSON 503 (not uvicorn's limit_concurrency, plain text)
  uvicorn.run(server, host=f.host, port=f.port, log_level='warning',
              http=connection_protocol(server, f.header_timeout_s, f.max_connections))


if __name__ == '__main__':
  app.run(main_running(run), flags_parser=flag_parser)
