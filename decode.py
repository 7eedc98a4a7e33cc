"""Translate with a trained workdir: python decode.py --workdir DIR --input FILE --output FILE

Reads FILE (or stdin) in blocks of --buffer_lines, translates each block and writes its lines
before reading the next (one output line per input line; empty lines stay empty), so memory
stays bounded and a terminal gets each typed line back at once. With --reference it reads
the input whole and prints sacreBLEU with its signature and chrF.

--format jsonl writes one JSON object per input line: the source's subwords and up to
--n_best hypotheses, each with its text, length-normalised score, log-probability, subwords,
per-subword log-probabilities and alignment (forced decoding, decoding/scoring.py).
--score_reference FILE translates nothing: it scores FILE's lines as translations of the
input (text: "logprob<TAB>score" per line; jsonl: the same object with that one hypothesis).
--prefix FILE starts each translation with its line's target prefix; --resume continues an
interrupted run from OUTPUT.partial.

The compiled programs are kept in WORKDIR/programs, so a later run with the same settings
starts without compiling (runtime/programs.py); --precompile only fills it: with the
programs of small jobs (--precompile_rows, --precompile_length), then those FILE's batches
need with --input FILE.
"""

from absl import app, flags

from transformer_nmt.cli import flag_parser, main_running
from transformer_nmt.decoding.settings import PRECOMPILE_LENGTH, PRECOMPILE_ROWS
from transformer_nmt.inference import options

options.define_model_flags()
options.define_decode_flags()  # each defaults to the run's own decode.* value
flags.adopt_module_key_flags(options)  # listed by --help with this program's own
flags.DEFINE_string('input', '-', 'Source text, one sentence per line; - for stdin.')
flags.DEFINE_string('output', '-', 'Where translations go; - for stdout.')
flags.DEFINE_string('reference', None, 'Reference translations for scoring.')
flags.DEFINE_bool('tokenized_bleu', False, 'Also print paper-style tokenized BLEU.')
flags.DEFINE_enum('format', 'text', ['text', 'jsonl'], 'text: one translation per line; jsonl: '
                  'one JSON object per line with hypotheses and scores.')
flags.DEFINE_integer('n_best', 1, 'Hypotheses per line, best first (at most the beam size; more '
                     'than 1 needs --format jsonl). A sentence can end with fewer: the search '
                     'stops once no live beam can win.')
flags.DEFINE_string('score_reference', None, 'Score these translations of the input (one per '
                    'line) instead of translating.')
flags.DEFINE_string('prefix', None, "Target prefixes, one per input line (empty: none): each "
                    "translation starts with its line's prefix and the search continues after "
                    'it.')
flags.DEFINE_bool('resume', False, 'Keep the translated lines in OUTPUT.partial as they are '
                  'written, with a record of what they translate in OUTPUT.partial.json; a run '
                  'interrupted before the end continues after the last recorded line there '
                  '(same input and flags: a partial of other settings or input is refused), '
                  'and OUTPUT.partial becomes OUTPUT at the end.')
flags.DEFINE_integer('buffer_lines', 0, 'Lines read, translated and written per block (0: 1 '
                     'when stdin is a terminal, so that a typed line is translated at once, '
                     'else 2000).')
flags.DEFINE_bool('precompile', False, 'Compile and store in WORKDIR/programs the programs of '
                  'small jobs (see --precompile_rows; also what lines typed at a terminal '
                  'need), then those the batches of --input need (none when it is a terminal), '
                  'writing no translations: run it once on text like the text to come (the '
                  'validation set, say) and later runs start at once.')
flags.DEFINE_integer('precompile_rows', PRECOMPILE_ROWS, 'With --precompile: the small jobs '
                     'made ready are of up to this many sentences (0: none) ...')
flags.DEFINE_integer('precompile_length', PRECOMPILE_LENGTH, '... of up to this many source '
                     'subwords, EOS included.')
flags.DEFINE_string('plot_attention', None, 'Directory for cross-attention heatmaps.')
flags.DEFINE_integer('plot_sentences', 3, 'How many sentences to plot.')
_JOB_FLAGS = ('input', 'output', 'reference', 'score_reference', 'prefix', 'format', 'n_best',
              'resume', 'buffer_lines', 'precompile', 'precompile_rows', 'precompile_length',
              'tokenized_bleu', 'plot_attention', 'plot_sentences')


def run() -> None:
  from transformer_nmt.decode_job import jobs
  job = {name: getattr(flags.FLAGS, name) for name in _JOB_FLAGS}
  jobs.run(jobs.DecodeJob(options.model_options(), options.decode_overrides(), **job))


if __name__ == '__main__':
  app.run(main_running(run), flags_parser=flag_parser)
