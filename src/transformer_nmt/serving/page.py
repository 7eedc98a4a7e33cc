"""serve.py's web page at /: a text box whose lines go to /v1/translate (fetch), the
translations with their n-best hypotheses and scores, and, for the translation or hypothesis
clicked, its cross-attention heatmap (the last decoder layer's, mean over heads: what
decode.py --plot_attention draws) as a table, source subwords across, target subwords down.
One self-contained HTML string: no files are read to serve it, nothing is fetched from
elsewhere, and model output only ever reaches the page as text (textContent)."""

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Transformer NMT</title>
<style>
  body { font-family: sans-serif; max-width: 60em; margin: 2em auto; }
  textarea { width: 100%; height: 8em; }
  .error { color: #b00; }
  .sentence { margin: 0.6em 0; }
  .hyp { margin-left: 1.5em; }
  .pick { font: inherit; border: 1px solid transparent; background: none; cursor: pointer;
          text-align: left; padding: 0.1em 0.3em; }
  .pick:hover, .pick.chosen { border-color: #36c; background: #eef3ff; }
  .hyp .pick { color: #555; }
  .score { color: #555; font-size: 90%; margin-left: 1em; }
  #attention { border-collapse: collapse; margin-top: 1em; font-size: 85%; }
  #attention td { width: 1.6em; height: 1.6em; border: 1px solid #eee; }
  #attention th { font-weight: normal; padding: 0 0.3em; }
  #attention th.src { writing-mode: vertical-rl; vertical-align: bottom; }
  #attention th.tgt { text-align: right; }
  #attention caption { text-align: left; color: #555; padding-bottom: 0.5em; }
</style>
</head>
<body>
<h1>Translate</h1>
<p>One sentence per line. Click a translation to see its attention.</p>
<textarea id="text"></textarea>
<p>
  <label>n-best <input id="n_best" type="number" min="1" value="1" style="width: 4em"></label>
  <label><input id="scores" type="checkbox"> scores</label>
  <label>API key <input id="key" type="password"></label>
  <button id="go">Translate</button>
</p>
<div id="out"></div>
<div id="heatmap"></div>
<script>
const out = document.getElementById('out');
const heatmap = document.getElementById('heatmap');

function element(tag, text, cls) {
  const e = document.createElement(tag);
  e.textContent = text;
  if (cls) e.className = cls;
  return e;
}

// One hypothesis' attention [tokens][sourceTokens] as a table of shaded cells.
function drawAttention(sourceTokens, h, caption) {
  const table = document.createElement('table');
  table.id = 'attention';
  table.appendChild(element('caption', caption));
  const head = table.insertRow();
  head.appendChild(element('th', ''));
  for (const s of sourceTokens) head.appendChild(element('th', s, 'src'));
  h.attention.forEach((weights, t) => {
    const row = table.insertRow();
    row.appendChild(element('th', h.tokens[t], 'tgt'));
    weights.forEach((w, s) => {
      const cell = row.insertCell();
      cell.style.backgroundColor = 'rgba(30, 80, 200, ' + w.toFixed(3) + ')';
      cell.title = h.tokens[t] + ' / ' + sourceTokens[s] + ': ' + w.toFixed(3);
    });
  });
  heatmap.replaceChildren(table);
}

// A button showing `text` that draws `h`'s attention when clicked.
function pick(text, sourceTokens, h, caption) {
  const b = element('button', text, 'pick');
  b.type = 'button';
  if (!h) { b.disabled = true; return b; }
  b.onclick = () => {
    for (const other of out.querySelectorAll('.chosen')) other.classList.remove('chosen');
    b.classList.add('chosen');
    drawAttention(sourceTokens, h, caption);
  };
  return b;
}

function show(answer, nBest, scores) {
  answer.translations.forEach((t, i) => {
    const hyps = t.hypotheses || [];
    const div = element('div', '', 'sentence');
    const best = pick(t.text, t.source_tokens, hyps[0],
                      'sentence ' + (i + 1) + ': cross-attention (last layer, mean of heads)');
    best.classList.add('best');
    div.appendChild(best);
    if (nBest > 1 || scores) {
      hyps.forEach((h, j) => {
        const line = element('div', '', 'hyp');
        line.appendChild(pick(h.text, t.source_tokens, h, 'sentence ' + (i + 1) +
                              ', hypothesis ' + (j + 1) + ': cross-attention'));
        if (scores) {
          line.appendChild(element('span', 'score ' + h.score.toFixed(3) + ', logprob ' +
                                   h.logprob.toFixed(3), 'score'));
        }
        div.appendChild(line);
      });
    }
    out.appendChild(div);
  });
}

document.getElementById('go').onclick = async () => {
  out.replaceChildren();
  heatmap.replaceChildren();
  const text = document.getElementById('text').value.split('\\n');
  const nBest = parseInt(document.getElementById('n_best').value, 10) || 1;
  const scores = document.getElementById('scores').checked;
  const body = {text: text, n_best: nBest, return_scores: scores, return_attention: true};
  const headers = {'Content-Type': 'application/json'};
  const key = document.getElementById('key').value;
  if (key) headers['Authorization'] = 'Bearer ' + key;
  try {
    const response = await fetch('/v1/translate', {method: 'POST', headers: headers,
                                                   body: JSON.stringify(body)});
    const answer = await response.json();
    if (!response.ok) {
      out.appendChild(element('p', answer.error || response.statusText, 'error'));
      return;
    }
    show(answer, nBest, scores);
  } catch (e) {
    out.appendChild(element('p', String(e), 'error'));
  }
};
</script>
</body>
</html>
"""
