"""serve.py's web page at /: a text box whose lines go to /v1/translate (fetch), and the
translations with their n-best hypotheses and scores. One self-contained HTML string: no
files are read to serve it."""

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Transformer NMT</title>
<style>
  body { font-family: sans-serif; max-width: 50em; margin: 2em auto; }
  textarea { width: 100%; height: 8em; }
  .error { color: #b00; }
  .hyp { color: #555; margin-left: 1.5em; }
</style>
</head>
<body>
<h1>Translate</h1>
<p>One sentence per line.</p>
<textarea id="text"></textarea>
<p>
  <label>n-best <input id="n_best" type="number" min="1" value="1" style="width: 4em"></label>
  <label><input id="scores" type="checkbox"> scores</label>
  <label>API key <input id="key" type="password"></label>
  <button id="go">Translate</button>
</p>
<div id="out"></div>
<script>
const out = document.getElementById('out');
function line(text, cls) {
  const p = document.createElement('p');
  p.textContent = text;
  if (cls) p.className = cls;
  out.appendChild(p);
}
document.getElementById('go').onclick = async () => {
  out.textContent = '';
  const text = document.getElementById('text').value.split('\\n');
  const nBest = parseInt(document.getElementById('n_best').value, 10) || 1;
  const body = {text: text, n_best: nBest,
                return_scores: document.getElementById('scores').checked};
  const headers = {'Content-Type': 'application/json'};
  const key = document.getElementById('key').value;
  if (key) headers['Authorization'] = 'Bearer ' + key;
  try {
    const response = await fetch('/v1/translate', {method: 'POST', headers: headers,
                                                   body: JSON.stringify(body)});
    const answer = await response.json();
    if (!response.ok) { line(answer.error || response.statusText, 'error'); return; }
    for (const t of answer.translations) {
      line(t.text);
      for (const h of (t.hypotheses || [])) {
        line(h.text + '  (score ' + h.score.toFixed(3) + ', logprob ' + h.logprob.toFixed(3)
             + ')', 'hyp');
      }
    }
  } catch (e) {
    line(String(e), 'error');
  }
};
</script>
</body>
</html>
"""
