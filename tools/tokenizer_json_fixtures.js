// Writes tests/fixtures/tokenizer_json/: tokenizer.json files in the shapes of real byte-level BPE models,
// built without training from GPT-2's byte tokens and first merges, and cases.json: texts of every kind
// and their ids from tokenizers.js (@huggingface/tokenizers). Run by tools/tokenizer_json_fixtures.sh.
// Usage: NODE_PATH=<npm folder>/node_modules node tools/tokenizer_json_fixtures.js GPT2_DIR OUT_DIR
"use strict";
const fs = require("fs");
const path = require("path");
const { Tokenizer } = require("@huggingface/tokenizers");

const [gpt2Dir, outDir] = process.argv.slice(2);
const kMerges = 1200;  // GPT-2's first merges: common English pieces, a few files of ~40 KB

// ---- the vocabulary: GPT-2's byte tokens (ids 0..255) and its first merges (results 256 + rank) ----
const gpt2Vocab = JSON.parse(fs.readFileSync(path.join(gpt2Dir, "vocab.json"), "utf8"));
const spelling = [];
for (const [token, id] of Object.entries(gpt2Vocab)) spelling[id] = token;
const merges = fs.readFileSync(path.join(gpt2Dir, "merges.txt"), "utf8").split("\n")
  .filter((line) => line && !line.startsWith("#version")).slice(0, kMerges).map((line) => line.split(" "));
merges.forEach(([a, b], rank) => {
  if (a + b !== spelling[256 + rank]) throw new Error(`merge ${rank} is not token ${256 + rank}`);
});
// GPT-2's bytes_to_unicode, for whole words added to the vocabulary without merges (ignore_merges finds them).
const byteChar = [];
{
  let next = 256;
  for (let b = 0; b < 256; ++b) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    byteChar[b] = String.fromCodePoint(printable ? b : next++);
  }
}
const byteLevel = (text) => Array.from(Buffer.from(text, "utf8"), (b) => byteChar[b]).join("");
const words = [" unbelievable", " tokenizer", " headlab", " 世界", "Hello"].map(byteLevel);

// A vocabulary object: `first` tokens (SmolLM's specials), then the byte tokens, merges' results, words.
function vocabulary(first = []) {
  const tokens = [...first, ...spelling.slice(0, 256 + kMerges)];
  for (const w of words) if (!tokens.includes(w)) tokens.push(w);
  return Object.fromEntries(tokens.map((t, id) => [t, id]));
}
const added = (content, id) =>
  ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
const split = (regex) => ({ type: "Split", pattern: { Regex: regex }, behavior: "Isolated", invert: false });
const byteLevelPre = (addPrefixSpace, useRegex) =>
  ({ type: "ByteLevel", add_prefix_space: addPrefixSpace, trim_offsets: true, use_regex: useRegex });

function tokenizerJson({ vocab, mergesAsPairs, specials, normalizer = null, preTokenizer, postProcessor = null,
                         ignoreMerges = false }) {
  return {
    version: "1.0", truncation: null, padding: null,
    added_tokens: specials.map(([content, id]) => added(content, id)),
    normalizer, pre_tokenizer: preTokenizer, post_processor: postProcessor,
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: ignoreMerges, vocab,
      merges: mergesAsPairs ? merges : merges.map(([a, b]) => `${a} ${b}`),
    },
  };
}
const after = (vocab, names) => names.map((name, i) => [name, Object.keys(vocab).length + i]);

// Meta-Llama-3-8B's pre-tokenizer, merges as pairs, ignore_merges, <|begin_of_text|> by the template.
const kLlama3 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" +
  "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const llamaVocab = vocabulary();
const llamaSpecials = after(llamaVocab, ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
  "<|reserved_special_token_1|>", "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_2|>",
  "<|eot_id|>"]);
const bot = llamaSpecials[0];
const llama3 = tokenizerJson({
  vocab: llamaVocab, mergesAsPairs: true, specials: llamaSpecials, ignoreMerges: true,
  preTokenizer: { type: "Sequence", pretokenizers: [split(kLlama3), byteLevelPre(false, false)] },
  postProcessor: { type: "Sequence", processors: [
    { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
    { type: "TemplateProcessing",
      single: [{ SpecialToken: { id: bot[0], type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
      pair: [{ SpecialToken: { id: bot[0], type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
             { SpecialToken: { id: bot[0], type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
      special_tokens: { [bot[0]]: { id: bot[0], ids: [bot[1]], tokens: [bot[0]] } } },
  ] },
});

// Qwen2's: single digits, NFC, merges as "a b" strings.
const kQwen2 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" +
  "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const qwenVocab = vocabulary();
const qwen2 = tokenizerJson({
  vocab: qwenVocab, mergesAsPairs: false, specials: after(qwenVocab, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
  normalizer: { type: "NFC" },
  preTokenizer: { type: "Sequence", pretokenizers: [split(kQwen2), byteLevelPre(false, false)] },
  postProcessor: { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
});

// SmolLM's: digits one by one, then GPT-2's pattern; its special tokens are the vocabulary's first ids.
const smolFirst = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
const smolVocab = vocabulary(smolFirst);
const smollm = tokenizerJson({
  vocab: smolVocab, mergesAsPairs: false, specials: smolFirst.map((t, id) => [t, id]),
  preTokenizer: { type: "Sequence", pretokenizers: [{ type: "Digits", individual_digits: true },
                                                     byteLevelPre(false, true)] },
});

// GPT-2's pattern with add_prefix_space, after a literal split at blank lines (each piece gets its space).
const prefixVocab = vocabulary();
const prefix = tokenizerJson({
  vocab: prefixVocab, mergesAsPairs: true, specials: after(prefixVocab, ["<|endoftext|>"]),
  preTokenizer: { type: "Sequence", pretokenizers: [
    { type: "Split", pattern: { String: "\n\n" }, behavior: "Isolated", invert: false }, byteLevelPre(true, true)] },
});

const tokenizers = { llama3, qwen2, smollm, prefix };

// ---- texts ----
const common = [
  ["empty", ""],
  ["english", "Hello world! The quick brown fox jumps over the lazy dog."],
  ["contractions", "I'm sure they've said it's what we'll do, you'd think. DON'T WE'LL SHE'S 'S they'RE"],
  ["numbers", "In 1984, 3.14159 and 1,000,000 or 12345678901234567890 -42 +7 0x1F 2024-11-27"],
  ["punctuation", "Wait... what?! (yes) [no] {maybe} <tag/> a--b ~!@#$%^&*_+=|\\/:;\"'`,.?"],
  ["spaces", "a  b   c    d          e"],
  ["leading_trailing_spaces", "   leading and trailing   "],
  ["tabs_newlines", "line one\nline two\n\n\tindented\t\ttabs\r\nwindows\r\n\n\n  \n end\n"],
  ["only_whitespace", " \t\n \n\n   "],
  ["code", "def f(x):\n    return x ** 2  # square\n\nfor i in range(10):\n\tprint(f(i))\n"],
  ["chinese", "我们今天去北京的故宫博物院参观。你好，世界！"],
  ["japanese", "東京タワーは日本の電波塔です。ひらがなとカタカナ"],
  ["vietnamese", "Tiếng Việt có dấu: Hà Nội, Thành phố Hồ Chí Minh."],
  ["turkish", "İstanbul'da ığdır şehri, Çağrı ÖZGÜR ve ŞEYMA: ılık süt içtiler."],
  ["arabic_hebrew", "مرحبا بالعالم שלום עולם"],
  ["russian_greek", "Привет, мир! Καλημέρα κόσμε 123"],
  ["emoji", "I love it 😀👍🏽 family: 👨‍👩‍👧‍👦 flag: 🇫🇷 heart ❤️ done."],
  // NFC composes these (Qwen2 normalises; the others keep them as they are).
  ["decomposed_accents", "Cafe\u0301 re\u0301sume\u0301 A\u030Angstro\u0308m n\u0303 \u1100\u1161\u11A8 Z\u0351\u0300"],
  ["unicode_spaces", "a\u00a0b\u3000c\u2003d e"],
  ["whole_words", " unbelievable tokenizer headlab 世界 unbelievably Hello headlabs"],
];
// Rust's Digits splits Unicode's numbers (\p{N}); tokenizers.js's only ASCII digits: no SmolLM case here.
const otherDigits = ["digits_other_scripts", "٣٤٥ ١٢ ¼ ½ Ⅻ ²³"];
function specialTexts(specials) {
  const names = specials.map(([content]) => content);
  return [
    ["special_alone", names[0]],
    ["specials_in_text", names.map((n, i) => `${i ? " " : ""}word${i}${n}`).join("") + " end"],
    ["specials_adjacent", names.join("") + names[names.length - 1] + "a"],
    ["special_lookalikes", names.map((n) => `${n.slice(0, -1)} ${n.slice(1)}`).join(" ")],
  ];
}

const cases = [];
const files = {};
for (const [name, json] of Object.entries(tokenizers)) {
  const file = `${name}.json`;
  fs.writeFileSync(path.join(outDir, file), JSON.stringify(json) + "\n");
  const tok = new Tokenizer(json, {});
  const withSpecials = tok.encode("a", { add_special_tokens: true }).ids;
  const plain = tok.encode("a", { add_special_tokens: false }).ids;
  files[name] = { file, bos: withSpecials.length > plain.length ? withSpecials[0] : null,
                  tokens: Object.keys(json.model.vocab).length +
                          json.added_tokens.filter((t) => !(t.content in json.model.vocab)).length };
  const texts = [...common, ...(name === "smollm" ? [] : [otherDigits]), ...specialTexts(json.added_tokens.map(
    (t) => [t.content, t.id]))];
  for (const [label, text] of texts) {
    const ids = tok.encode(text, { add_special_tokens: false }).ids;
    const decoded = ids.length ? tok.decode(ids) : "";
    const expected = json.normalizer ? text.normalize("NFC") : text;
    // add_prefix_space's spaces stay in the decoded text (Hugging Face's ByteLevel decoder keeps them)
    if (name !== "prefix" && decoded !== expected) throw new Error(`${name} ${label}: tokenizers.js does not round-trip`);
    cases.push({ tokenizer: name, name: label, text, ids, decoded });
  }
}
const out = { generator: "tools/tokenizer_json_fixtures.sh (@huggingface/tokenizers 0.2.0)", tokenizers: files, cases };
fs.writeFileSync(path.join(outDir, "cases.json"), JSON.stringify(out, null, 1) + "\n");
console.error(`tokenizer_json_fixtures: ${cases.length} cases for ${Object.keys(files).length} tokenizers in ${outDir}`);
