// Compares zinf's tokens with a reference tokenizer's, token for token:
//   node compare.mjs --impl gpt-tokenizer|llama3-tokenizer-js|hf [--json TOKENIZER.json]
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
  encodeDoc = (t) => g.encode(t, { allowedSpecial: 'all' });
  decodeIds = (ids) => g.decode(ids);
} else if (opt.impl === 'llama3-tokenizer-js') {
  const l3 = (await import(require.resolve('llama3-tokenizer-js'))).default;
  encodeDoc = (t) => l3.encode(t, { bos: false, eos: false });
  decodeIds = (ids) => l3.decode(ids);
} else if (opt.impl === 'hf') {
  const { Tokenizer } = await import(require.resolve('@huggingface/tokenizers'));
  const tok = new Tokenizer(JSON.parse(fs.readFileSync(opt.json, 'utf8')), { clean_up_tokenization_spaces: false });
  encodeDoc = (t) => tok.encode(t, { add_special_tokens: false }).ids;
  decodeIds = (ids) => tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
} else {
  console.error(`compare.mjs: --impl ${opt.impl}: gpt-tokenizer, llama3-tokenizer-js or hf`);
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
