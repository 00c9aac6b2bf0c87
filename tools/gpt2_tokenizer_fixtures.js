// Writes tests/fixtures/gpt2_tokenizer_cases.json: texts of every kind the tokenizer must handle and
// their GPT-2 ids from js-tiktoken, cross-checked with gpt-3-encoder (which knows no special tokens,
// so texts holding <|endoftext|> are checked by js-tiktoken alone). Run by tools/gpt2_tokenizer_fixtures.sh.
// Usage: NODE_PATH=<npm folder>/node_modules node tools/gpt2_tokenizer_fixtures.js OUT.json
"use strict";
const fs = require("fs");
const { getEncoding } = require("js-tiktoken");
const gpt3 = require("gpt-3-encoder");

const tiktoken = getEncoding("gpt2");
const cases = [
  ["empty", ""],
  ["english", "Hello world! The quick brown fox jumps over the lazy dog."],
  ["contractions", "I'm sure they've said it's what we'll do, you'd think, they're ok. DON'T 'S"],
  ["numbers", "In 1984, 3.14159 and 1,000,000 or 12345678901234567890 -42 +7 0x1F 1e-9"],
  ["punctuation", "Wait... what?! (yes) [no] {maybe} <tag/> a--b ~!@#$%^&*_+=|\\/:;\"'`,.?"],
  ["long_word", "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism " +
                "supercalifragilisticexpialidocious" + "x".repeat(300)],
  ["spaces", "a  b   c    d          e"],
  ["leading_trailing_spaces", "   leading and trailing   "],
  ["tabs_newlines", "line one\nline two\n\n\tindented\t\ttabs\r\nwindows\r\n\n\n  \n end\n"],
  ["only_whitespace", " \t\n \n\n   "],
  ["code", "def f(x):\n    return x ** 2  # square\n\nfor i in range(10):\n\tprint(f(i))\n"],
  ["chinese", "我们今天去北京的故宫博物院参观。你好，世界！"],
  ["japanese", "東京タワーは日本の電波塔です。ひらがなとカタカナ"],
  ["vietnamese", "Tiếng Việt có dấu: Hà Nội, Thành phố Hồ Chí Minh, người Việt Nam."],
  ["turkish", "İstanbul'da ığdır şehri, Çağrı ÖZGÜR ve ŞEYMA: ılık süt içtiler."],
  ["emoji", "I love it 😀👍🏽 family: 👨‍👩‍👧‍👦 flag: 🇫🇷 heart ❤️ done."],
  ["combining_marks", "e\u0301 a\u0300 n\u0303o Zalgo: Z\u0351\u0300a\u0307\u0308l\u0316g\u0334o"],
  ["arabic_hebrew", "مرحبا بالعالم שלום עולם"],
  ["russian_greek", "Привет, мир! Καλημέρα κόσμε 123"],
  ["nbsp_and_unicode_spaces", "a\u00a0b\u3000c\u2003d e"],
  ["digits_other_scripts", "٣٤٥ ١٢ ¼ ½ Ⅻ ²³"],
  ["endoftext_alone", "<|endoftext|>"],
  ["endoftext_in_text", "First document.<|endoftext|>Second document <|endoftext|> third"],
  ["endoftext_twice", "<|endoftext|><|endoftext|>a"],
  ["endoftext_lookalike", "<|endoftext| and <|endoftext and |endoftext|>"],
  ["mixed", "Résumé: naïve café — “quotes” ‘single’ … 10% off! €5/£4/¥300 ©2024 ™"],
];

const out = [];
for (const [name, text] of cases) {
  const ids = Array.from(tiktoken.encode(text, "all"));
  if (tiktoken.decode(ids) !== text) throw new Error(`${name}: js-tiktoken does not round-trip`);
  let checked_by = "js-tiktoken";
  if (!text.includes("<|endoftext|>")) {
    const other = gpt3.encode(text);
    if (JSON.stringify(other) !== JSON.stringify(ids)) {
      console.error(`gpt2_tokenizer_fixtures: ${name}: gpt-3-encoder disagrees; keeping js-tiktoken's ids`);
    } else {
      checked_by = "js-tiktoken, gpt-3-encoder";
    }
  }
  out.push({ name, text, ids, checked_by });
}
const json = "[\n" + out.map((c) => "  " + JSON.stringify(c)).join(",\n") + "\n]\n";
fs.writeFileSync(process.argv[2], json);
console.error(`gpt2_tokenizer_fixtures: wrote ${out.length} cases to ${process.argv[2]}`);
