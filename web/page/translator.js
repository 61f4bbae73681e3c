// The page's translator: what src/runtime/generation.py's Translator does in Python, in the
// same order, so the page gives `python -m src.infer`'s exact text for the same file:
// SentencePiece ids + EOS (cut to the model's limit, with a warning), non-blank lines sorted by
// source tokens (ties by position) into batches of 32, one session.run per batch with the
// contract's feeds (src/runtime/contract.py), PAD and special ids dropped, stray byte pieces
// dropped, spaces between CJK characters removed, the confidence from the file's calibration.
// config.json (written by `python -m src.web build`) carries what Python reads from the file's
// metadata, since onnxruntime-web does not expose metadata_props.

import * as ort from './ort/ort.wasm.min.mjs';
import { SentencePieceProcessor } from '@sctg/sentencepiece-js';

export const BATCH_SIZE = 32; // src.infer's --batch-size default

// Python's str.isspace() characters: a line of only these is blank (str.strip() is empty).
// JavaScript's \s differs (it has U+FEFF, lacks U+001C-U+001F and U+0085).
const PY_SPACE = /^[\t\n\v\f\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*$/;
const BROKEN_BYTE = /\ufffd/g; // src/data/subword.py drop_broken_bytes

export function isBlank(line) {
  return PY_SPACE.test(line);
}

// src/data/subword.py join_cjk: spaces between two CJK characters go; the ranges come from
// config.json (subword.CJK_RANGES), so the two sides cannot drift apart.
export function cjkJoiner(ranges) {
  const hex = (code) => '\\u' + code.toString(16).padStart(4, '0');
  const cls = '[' + ranges.map(([a, b]) => hex(a) + '-' + hex(b)).join('') + ']';
  const spaces = new RegExp(`(?<=${cls}) +(?=${cls})`, 'g');
  return (text) => text.replace(spaces, '');
}

// src/runtime/contract.py max_new_tokens
export function maxNewTokens(longestSource, ratio, limit) {
  return Math.min(Math.floor(ratio * longestSource) + 10, limit);
}

// src/runtime/length_batches.py length_batches: indices of the non-blank lines, shortest first
// (ties by position), cut into batches.
export function lengthBatches(lengths, batchSize) {
  const order = [...lengths.keys()].sort((a, b) => lengths.get(a) - lengths.get(b) || a - b);
  const batches = [];
  for (let i = 0; i < order.length; i += batchSize) batches.push(order.slice(i, i + batchSize));
  return batches;
}

// src/runtime/confidence.py mean_logp, confidence and Calibration
export function confidence(score, tokens, lengthPenalty, calibration) {
  let feature;
  if (lengthPenalty === 1.0) feature = score;
  else if (!tokens) return null;
  else feature = (score * tokens ** lengthPenalty) / tokens;
  if (!Number.isFinite(feature)) return 0.0;
  if (!calibration) return Math.exp(feature);
  const x = calibration.slope * feature + calibration.intercept;
  return x >= 0 ? 1 / (1 + Math.exp(-x)) : Math.exp(x) / (1 + Math.exp(x));
}

async function fetchBytes(url, onProgress, expectedBytes) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status} ${response.statusText}`);
  const total = Number(response.headers.get('Content-Length')) || expectedBytes || 0;
  if (!response.body || !onProgress) return new Uint8Array(await response.arrayBuffer());
  const reader = response.body.getReader();
  const chunks = [];
  let received = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    received += value.length;
    onProgress(received, total);
  }
  const bytes = new Uint8Array(received);
  let at = 0;
  for (const chunk of chunks) { bytes.set(chunk, at); at += chunk.length; }
  return bytes;
}

async function loadTokenizer(url) {
  const processor = new SentencePieceProcessor();
  await processor.loadFromB64StringModel((await (await fetch(url)).text()).trim());
  return processor;
}

export class Translator {
  // `threads`: ONNX Runtime's WebAssembly threads (0: its default, which is one thread unless
  // the page is cross-origin isolated).
  static async load(base, { threads = 0, onProgress = null } = {}) {
    const url = (name) => new URL(name, base).href;
    const response = await fetch(url('config.json'));
    if (!response.ok) throw new Error(`config.json: HTTP ${response.status}`);
    const config = await response.json();
    if (threads > 0) ort.env.wasm.numThreads = threads;
    const [modelBytes, source, target] = await Promise.all([
      fetchBytes(url(config.model), onProgress, config.model_bytes),
      loadTokenizer(url(config.source_tokenizer)),
      loadTokenizer(url(config.target_tokenizer)),
    ]);
    const session = await ort.InferenceSession.create(modelBytes, {
      executionProviders: ['wasm'], graphOptimizationLevel: 'all' });
    return new Translator(config, session, source, target);
  }

  constructor(config, session, source, target) {
    Object.assign(this, { config, session, source, target });
    this.joinCjk = cjkJoiner(config.cjk_ranges);
    this.threads = ort.env.wasm.numThreads;
  }

  // Source ids + EOS, cut to the model's limit; `warn` gets Python's warning line.
  encode(text, lineNo, warn) {
    let ids = this.source.encodeIds(text);
    const limit = this.config.max_source_tokens - 1;
    if (ids.length > limit) {
      warn(`line ${lineNo}: ${ids.length} tokens, truncated to the model's limit of ${limit}`);
      ids = ids.slice(0, limit);
    }
    return [...ids, this.config.eos_id];
  }

  decode(ids) {
    const kept = ids.filter((i) => i > this.config.eos_id);
    return this.joinCjk(this.target.decodeIds(kept).replace(BROKEN_BYTE, ''));
  }

  // One entry per line: null for a blank line, else {hypotheses: [{text, score, tokens}],
  // confidence}; `warnings` collects the lines cut to the model's limit.
  async translate(lines, { beam = null, nBest = 1, batchSize = BATCH_SIZE, warn = () => {} } = {}) {
    beam = beam || this.config.beam_size;
    if (!(nBest >= 1 && nBest <= beam)) {
      throw new Error(`n-best ${nBest}: a search with beam ${beam} returns 1 to ${beam} ` +
                      'hypotheses (raise the beam for more)');
    }
    const encoded = new Map();
    lines.forEach((line, i) => { if (!isBlank(line)) encoded.set(i, this.encode(line, i + 1, warn)); });
    const lengths = new Map([...encoded].map(([i, ids]) => [i, ids.length]));
    const results = lines.map(() => null);
    for (const batch of lengthBatches(lengths, batchSize)) {
      const found = await this.run(batch.map((i) => encoded.get(i)), beam, nBest);
      batch.forEach((i, k) => { results[i] = found[k]; });
    }
    return results;
  }

  async run(rows, beam, nBest) {
    const { pad_id: pad, length_penalty: lengthPenalty } = this.config;
    const width = Math.max(...rows.map((r) => r.length));
    const ids = new Int32Array(rows.length * width).fill(pad);
    rows.forEach((row, i) => ids.set(row, i * width));
    const newTokens = maxNewTokens(width, this.config.max_length_ratio,
                                   this.config.max_output_tokens);
    const one = (type, value) => new ort.Tensor(type, type === 'int32'
      ? Int32Array.from([value]) : Float32Array.from([value]), [1]);
    const feeds = {
      input_ids: new ort.Tensor('int32', ids, [rows.length, width]),
      max_length: one('int32', newTokens + 1),
      min_length: one('int32', 0),
      num_beams: one('int32', beam),
      num_return_sequences: one('int32', nBest),
      length_penalty: one('float32', lengthPenalty),
      repetition_penalty: one('float32', 1.0),
      return_scores: one('int32', 1), // optional, but the web build wants every input fed
    };
    const outputs = await this.session.run(feeds);
    const [, n, t] = outputs.sequences.dims;
    const sequences = outputs.sequences.data;
    const scores = outputs.sequences_scores.data;
    const calibration = this.config.calibration;
    return rows.map((_, r) => {
      const hypotheses = [];
      for (let h = 0; h < n; h++) {
        const start = (r * n + h) * t;
        const tokenIds = Array.from(sequences.subarray(start + 1, start + t)).filter((x) => x !== pad);
        hypotheses.push({
          text: this.decode(tokenIds),
          score: scores[r * n + h],
          tokens: tokenIds.length + (tokenIds.length < newTokens ? 1 : 0),
        });
      }
      const best = hypotheses[0];
      return { hypotheses, confidence: confidence(best.score, best.tokens, lengthPenalty, calibration) };
    });
  }
}
