// The peers of scripts/bench-tokenize.sh: one text file encoded whole by
//   --impl tiktoken   tiktoken's WebAssembly build, GPT-2's encoding (r50k)
//   --impl hf         @huggingface/tokenizers (JavaScript) with --json TOKENIZER.json
// on one thread (node's), printing {"impl", "bytes", "tokens", "encode_s",
// "mb_per_s"} (the encode alone, the file read and the tokenizer loaded
// before the clock starts) on stdout.
// Usage: node bench.mjs --impl tiktoken|hf [--json tokenizer.json] FILE
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '..', '..', '.cache', 'tokenizer-refs', 'package.json'));
const args = process.argv.slice(2);
const opt = {};
let file;
for (let i = 0; i < args.length; i++) {
  if (args[i].startsWith('--')) opt[args[i].slice(2)] = args[++i];
  else file = args[i];
}
const text = fs.readFileSync(file, 'utf8');
let encode;
if (opt.impl === 'tiktoken') {
  const { get_encoding } = require('tiktoken');
  const enc = get_encoding('gpt2');
  encode = (t) => enc.encode_ordinary(t).length;
} else if (opt.impl === 'hf') {
  // (its CommonJS build is what require finds; the ES module beside it has the class)
  const { Tokenizer } = await import(path.join(path.dirname(require.resolve('@huggingface/tokenizers')), 'tokenizers.mjs'));
  const tok = new Tokenizer(JSON.parse(fs.readFileSync(opt.json, 'utf8')), {});
  encode = (t) => tok.encode(t, { add_special_tokens: false }).ids.length;
} else {
  console.error('bench.mjs: --impl tiktoken or hf');
  process.exit(64);
}
const t0 = performance.now();
const tokens = encode(text);
const s = (performance.now() - t0) / 1000;
const bytes = Buffer.byteLength(text);
console.log(JSON.stringify({ impl: opt.impl, bytes, tokens, encode_s: s, mb_per_s: bytes / 1e6 / s }));
