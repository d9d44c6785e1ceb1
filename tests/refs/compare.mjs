// Compares zinf's tokens with a reference tokenizer's, token for token:
//   node compare.mjs --impl gpt-tokenizer|tiktoken|llama3-tokenizer-js|hf [--json TOKENIZER.json]
//        --ours TOKENS.bin --sep ID [--begin ID] [--text DECODED] CORPUS.jsonl...
// The reference encodes each document ("text" of each record, in order); the
// stream it must equal is, per document, the separator, the begin ids, the
// document's ids: what zinf-tokenize writes. With --text, zinf's decode of
// the file (zinf-tokenize --decode) must equal the reference's decode of the
// same ids. Prints one line and exits 0 when equal; else the first
// difference, its document and kind and the text around it, and exits 1.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '..', '..', '.cache', 'tokenizer-refs', 'package.json'));

const args = process.argv.slice(2);
const opt = {};
const corpora = [];
for (let i = 0; i < args.length; i++) {
  if (args[i].startsWith('--')) opt[args[i].slice(2)] = args[++i];
  else corpora.push(args[i]);
}
const sep = opt.sep !== undefined && opt.sep !== 'none' ? [Number(opt.sep)] : [];
const begin = opt.begin !== undefined ? [Number(opt.begin)] : [];

let encodeDoc, decodeIds;
if (opt.impl === 'gpt-tokenizer') {
  const g = await import(require.resolve('gpt-tokenizer/encoding/r50k_base'));
  // gpt-tokenizer 4.0.0 finds a special token only at the start of the text
  // (its search adds the start offset twice): the text is split at
  // <|endoftext|> here, as tiktoken's encode(allowed_special='all') splits
  // it, and gpt-tokenizer encodes every piece between.
  encodeDoc = (t) => t.split('<|endoftext|>').flatMap((piece, i) => [...(i ? [50256] : []), ...g.encode(piece)]);
  decodeIds = (ids) => g.decode(ids);
} else if (opt.impl === 'tiktoken') {
  const { get_encoding } = require('tiktoken');
  const enc = get_encoding('gpt2');
  encodeDoc = (t) => Array.from(enc.encode(t, 'all'));
  decodeIds = (ids) => new TextDecoder().decode(enc.decode(new Uint32Array(ids)));
} else if (opt.impl === 'llama3-tokenizer-js') {
  const l3 = (await import(require.resolve('llama3-tokenizer-js'))).default;
  encodeDoc = (t) => l3.encode(t, { bos: false, eos: false });
  decodeIds = (ids) => l3.decode(ids);
} else if (opt.impl === 'hf') {
  // Two places where @huggingface/tokenizers 0.2.0 (JavaScript) departs from
  // the Rust library whose files these are, put back as Rust has them:
  // - its Digits takes JavaScript's \d, ASCII only, where Rust's splits on
  //   char::is_numeric (Unicode's N: ٨, ½, Ⅻ): given here as the Split Rust's
  //   Digits is (each number character isolated, or runs of them);
  // - its TextDecoder drops a U+FEFF that begins a run of <0x..> bytes, where
  //   Rust's String::from_utf8 keeps it: decoding here keeps it.
  const Decoder = globalThis.TextDecoder;
  globalThis.TextDecoder = class extends Decoder {
    constructor(label, options) { super(label, { ...options, ignoreBOM: true }); }
  };
  const digitsAsRust = (p) => {
    if (!p) return p;
    if (p.type === 'Sequence') return { ...p, pretokenizers: p.pretokenizers.map(digitsAsRust) };
    if (p.type !== 'Digits') return p;
    return { type: 'Split', pattern: { Regex: p.individual_digits ? '\\p{N}' : '\\p{N}+' }, behavior: 'Isolated', invert: false };
  };
  // (its CommonJS build is what require finds; the ES module beside it has the class)
  const { Tokenizer } = await import(path.join(path.dirname(require.resolve('@huggingface/tokenizers')), 'tokenizers.mjs'));
  const json = JSON.parse(fs.readFileSync(opt.json, 'utf8'));
  json.pre_tokenizer = digitsAsRust(json.pre_tokenizer);
  const tok = new Tokenizer(json, { clean_up_tokenization_spaces: false });
  encodeDoc = (t) => tok.encode(t, { add_special_tokens: false }).ids;
  decodeIds = (ids) => tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
} else {
  console.error(`compare.mjs: --impl ${opt.impl}: gpt-tokenizer, tiktoken, llama3-tokenizer-js or hf`);
  process.exit(64);
}

// zinf's file: llm.c's header (int32 magic 20240520, version, count), then the tokens.
const buf = fs.readFileSync(opt.ours);
const head = new Int32Array(buf.buffer, buf.byteOffset, 256);
if (head[0] !== 20240520) throw new Error(`${opt.ours}: not a token file`);
const ours = head[1] === 2 ? new Uint32Array(buf.buffer.slice(buf.byteOffset + 1024, buf.byteOffset + 1024 + 4 * head[2]))
                           : new Uint16Array(buf.buffer.slice(buf.byteOffset + 1024, buf.byteOffset + 1024 + 2 * head[2]));

const docs = [];
for (const file of corpora)
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) if (line) docs.push(JSON.parse(line));

const t0 = performance.now();
let at = 0;
const kinds = new Map();
for (let d = 0; d < docs.length; d++) {
  const want = [...sep, ...begin, ...encodeDoc(docs[d].text)];
  kinds.set(docs[d].kind, (kinds.get(docs[d].kind) ?? 0) + 1);
  for (let i = 0; i < want.length; i++, at++) {
    if (ours[at] === want[i]) continue;
    const k = i - sep.length - begin.length;
    const got = Array.from(ours.slice(at, at + 8));
    console.log(`FAIL ${opt.impl}${opt.json ? ' ' + path.basename(opt.json) : ''}: document ${d} (${docs[d].kind}) ` +
                `token ${k}: zinf ${JSON.stringify(got)} reference ${JSON.stringify(want.slice(i, i + 8))}; ` +
                `the reference's tokens there decode to ${JSON.stringify(decodeIds(want.slice(Math.max(i - 3, 0), i + 5)))}`);
    process.exit(1);
  }
}
if (at !== ours.length) {
  console.log(`FAIL ${opt.impl}: zinf wrote ${ours.length} tokens, the reference ${at}`);
  process.exit(1);
}
const seconds = (performance.now() - t0) / 1000;
let decoded = '';
if (opt.text !== undefined) {
  const text = fs.readFileSync(opt.text, 'utf8');
  const ref = decodeIds(Array.from(ours));
  if (text !== ref) {
    let i = 0;
    while (i < text.length && text[i] === ref[i]) i++;
    console.log(`FAIL ${opt.impl}: zinf's decode differs from the reference's at character ${i}: ` +
                `zinf ${JSON.stringify(text.slice(i, i + 40))} reference ${JSON.stringify(ref.slice(i, i + 40))}`);
    process.exit(1);
  }
  decoded = `, and its decode (${text.length} characters)`;
}
console.log(`ok ${opt.impl}${opt.json ? ' ' + path.basename(opt.json) : ''}: ${docs.length} documents ` +
            `(${[...kinds].map(([k, n]) => `${n} ${k}`).join(', ')}), ${ours.length} tokens equal${decoded} ` +
            `(the reference took ${seconds.toFixed(2)} s)`);
