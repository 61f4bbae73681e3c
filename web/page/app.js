// The page: loads the model (with its download progress), translates the text box line by line
// with the chosen beam and n-best, and shows each line's translations with their scores and
// confidence, the time per sentence and the threads in use. Every failure is shown on the page.
// `window.nmt` exposes the translator to scripts (the browser test, benchmarks).

import { Translator, isBlank } from './translator.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const threads = Number(params.get('threads')) || 0;

function message(text, kind = 'error') {
  const item = document.createElement('li');
  item.className = kind;
  item.textContent = text;
  $('messages').append(item);
}

function megabytes(bytes) {
  return (bytes / 1e6).toFixed(1) + ' MB';
}

function progress(received, total) {
  const bar = $('progress');
  if (total) { bar.max = total; bar.value = received; }
  $('status').textContent = total
    ? `Downloading the model: ${megabytes(received)} of ${megabytes(total)}`
    : `Downloading the model: ${megabytes(received)}`;
}

function number(value, digits) {
  return value === null || value === undefined ? '' : value.toFixed(digits);
}

function show(lines, results) {
  const list = $('results');
  list.replaceChildren();
  results.forEach((result, i) => {
    if (result === null) return;
    const item = document.createElement('li');
    item.value = i + 1;
    const source = document.createElement('div');
    source.className = 'source';
    source.textContent = lines[i];
    item.append(source);
    const table = document.createElement('table');
    result.hypotheses.forEach((hyp, rank) => {
      const row = table.insertRow();
      row.className = rank === 0 ? 'best' : 'other';
      row.insertCell().textContent = hyp.text;
      row.insertCell().textContent = number(hyp.score, 3);
      row.insertCell().textContent = rank === 0 ? number(result.confidence, 2) : '';
    });
    const head = table.createTHead().insertRow();
    for (const name of ['translation', 'score', 'confidence']) {
      const cell = document.createElement('th');
      cell.textContent = name;
      head.append(cell);
    }
    item.append(table);
    list.append(item);
  });
}

async function onTranslate(translator) {
  $('messages').replaceChildren();
  const lines = $('source').value.split(/\r?\n/);
  if (lines.every(isBlank)) {
    message('Nothing to translate: type one English sentence per line.');
    return;
  }
  const beam = Number($('beam').value);
  const nBest = Number($('nbest').value);
  if (!Number.isInteger(beam) || beam < 1 || beam > translator.config.max_beam) {
    message(`Beam size must be a whole number from 1 to ${translator.config.max_beam}.`);
    return;
  }
  $('translate').disabled = true;
  $('status').textContent = 'Translating…';
  try {
    const started = performance.now();
    const results = await translator.translate(lines, {
      beam, nBest, warn: (text) => message(text, 'warning') });
    const ms = performance.now() - started;
    const count = results.filter((r) => r !== null).length;
    show(lines, results);
    $('status').textContent = `${count} sentence${count === 1 ? '' : 's'} in ${ms.toFixed(0)} ms ` +
      `(${(ms / count).toFixed(1)} ms per sentence), beam ${beam}, ` +
      `${translator.threads} thread${translator.threads === 1 ? '' : 's'}`;
  } catch (error) {
    message(`Translation failed: ${error.message || error}`);
    $('status').textContent = '';
  } finally {
    $('translate').disabled = false;
  }
}

async function main() {
  if (typeof WebAssembly !== 'object') {
    throw new Error('this browser has no WebAssembly');
  }
  const started = performance.now();
  const translator = await Translator.load(new URL('.', location.href), {
    threads, onProgress: progress });
  const { config } = translator;
  $('beam').value = config.beam_size;
  $('beam').max = config.max_beam;
  $('model').textContent = `${config.model} (${megabytes(config.model_bytes)}), ` +
    `${translator.threads} thread${translator.threads === 1 ? '' : 's'}` +
    (self.crossOriginIsolated ? '' : ' (the page is not cross-origin isolated: one thread)');
  $('status').textContent = `Ready in ${((performance.now() - started) / 1000).toFixed(1)} s.`;
  $('progress').hidden = true;
  $('translate').disabled = false;
  $('translate').addEventListener('click', () => onTranslate(translator));
  return translator;
}

const ready = main();
ready.catch((error) => {
  $('status').textContent = '';
  $('progress').hidden = true;
  message(`The model failed to load: ${error.message || error}`);
});
window.nmt = {
  ready,
  translate: async (lines, options = {}) => {
    const translator = await ready;
    const warnings = [];
    const results = await translator.translate(lines, { ...options, warn: (w) => warnings.push(w) });
    return { results, warnings, threads: translator.threads };
  },
};
