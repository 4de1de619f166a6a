"""Write tests/data/bpe_golden.json: hard texts with the ids GPT-2's reference tokenizer gives.

The reference is tiktoken's `gpt2` encoding, built offline from the vendored
encoder.json and vocab.bpe (their sha256 are the ones tiktoken pins for OpenAI's
files). Dev-only: `pip install tiktoken` (made with 0.14.0). The tests only read
the JSON. Run:

    python tests/data/make_bpe_golden.py
"""
import json
import os
import random

os.environ["TIKTOKEN_CACHE_DIR"] = ""  # read the local files, cache nothing
import tiktoken  # noqa: E402
from tiktoken.load import data_gym_to_mergeable_bpe_ranks  # noqa: E402
from tiktoken_ext import openai_public  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = os.path.join(HERE, "..", "..", "data", "gpt2-vocab")


def reference_encoding():
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=os.path.join(VOCAB, "vocab.bpe"),
        encoder_json_file=os.path.join(VOCAB, "encoder.json"),
        vocab_bpe_hash="1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
        encoder_json_hash="196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    )
    return tiktoken.Encoding(name="gpt2", explicit_n_vocab=50257, pat_str=openai_public.r50k_pat_str,
                             mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256})


SCRIPTS = {
    "latin": "The quick brown fox jumps over the lazy dog. Ça va? Straße, naïve, Æsir, Łódź, İstanbul",
    "greek": "Καλημέρα κόσμε, ξεσκεπάζω την ψυχοφθόρα βδελυγμία",
    "cyrillic": "Съешь же ещё этих мягких французских булок, да выпей чаю. Ёжик, Ђорђе",
    "armenian": "Բարեւ աշխարհ, Հայաստան",
    "georgian": "გამარჯობა მსოფლიო, ქართული",
    "hebrew": "שלום עולם, עִבְרִית עם ניקוד",
    "arabic": "مرحبا بالعالم، اللُّغَةُ العَرَبِيَّة ١٢٣",
    "persian": "سلام دنیا، زبان فارسی ۱۲۳۴",
    "syriac": "ܫܠܡܐ ܥܠܡܐ",
    "thaana": "ދިވެހި ބަސް",
    "devanagari": "नमस्ते दुनिया, हिन्दी भाषा क्षत्रिय ०१२३",
    "bengali": "ওহে বিশ্ব, বাংলা ভাষা ০১২৩",
    "gurmukhi": "ਸਤ ਸ੍ਰੀ ਅਕਾਲ ਦੁਨੀਆ ੧੨੩",
    "gujarati": "નમસ્તે વિશ્વ ૧૨૩",
    "oriya": "ନମସ୍କାର ବିଶ୍ୱ",
    "tamil": "வணக்கம் உலகம், தமிழ் ௧௨௩",
    "telugu": "హలో ప్రపంచం, తెలుగు",
    "kannada": "ಹಲೋ ವಿಶ್ವ, ಕನ್ನಡ ೧೨೩",
    "malayalam": "ഹലോ വേൾഡ്, മലയാളം",
    "sinhala": "හෙලෝ ලෝකය, සිංහල",
    "thai": "สวัสดีชาวโลก ภาษาไทย ๑๒๓",
    "lao": "ສະບາຍດີໂລກ ພາສາລາວ ໑໒໓",
    "tibetan": "བཀྲ་ཤིས་བདེ་ལེགས། ༡༢༣",
    "myanmar": "မင်္ဂလာပါ ကမ္ဘာ ၁၂၃",
    "khmer": "សួស្តី​ពិភពលោក ភាសាខ្មែរ ១២៣",
    "mongolian": "ᠮᠣᠩᠭᠣᠯ ᠪᠢᠴᠢᠭ᠌ ᠑᠒᠓",
    "ethiopic": "ሰላም ለዓለም፣ አማርኛ ፩፪፫",
    "cherokee": "ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ",
    "canadian_syllabics": "ᐊᒥᐦᑐᓴᐤ ᓀᐦᐃᔭᐍᐏᐣ",
    "hangul": "안녕하세요 세계, 한국어 텍스트",
    "hiragana_katakana": "こんにちは世界、カタカナとひらがな。ｶﾀｶﾅ",
    "cjk": "你好，世界！汉字與漢字，龍龘𠀀𪚥",
    "yi": "ꆈꌠꁱꂷ",
    "vai": "ꕙꔤ ꕞꕌꔳ",
    "runic_gothic": "ᚠᚢᚦᚨᚱᚲ 𐌲𐌿𐍄𐌹𐍃𐌺",
    "math_alphanumerics": "𝐀𝐁𝐂 𝔸𝔹ℂ 𝒜ℬ𝒞 ∀x∈ℝ: x²≥0 ∑∫∂√∞",
    "unicode16": "Ᲊᲊ 𐵀𐵁𐵂 (Garay) 𐗀𐗁 (Todhri) ᲉU+1C89",
    "unicode17": "𐥀𐥁𐥂 (Sidetic) 𑶰𑶱 (Tolong Siki) 𖺠𖺡 (Beria Erfe) 𲎰𲎱 (CJK Ext J)",
}
# Letters new in Unicode 16 / 17 next to Latin letters and punctuation: whether
# they count as \p{L} decides where the pieces are cut.
UNICODE_EDGES = ["aᲉb (Ᲊ).", "x𐵀y,𐵁!", "a𐥀b (𐥀). 𐥀,", "Tolong𑶰Siki.𑶱", "word𖺠 (𖺡)", "漢𲎰字,𲎱."]

EMOJI = [
    "🤗", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵🇫🇷", "1️⃣#️⃣", "🧑🏿‍🚀 to the moon 🚀🌕",
    "👋🏻👋🏼👋🏽👋🏾👋🏿", "❤️‍🔥 and ❤", "🫠🫡🪿", "😀😃😄😁😆😅😂🤣",
]
COMBINING = [
    "e\u0301 vs é", "n\u0303 a\u0308 o\u0302", "Z\u0351\u0362a\u0315\u0340l\u0316g\u0334o\u035c",
    "\u0301 leading combining mark", "क्षि ञ्जी", "가\u11a8 (Hangul jamo)", "a\u20dd\u20e3",
]
CONTROL = [
    "\x00", "a\x00b", "\x00\x01\x02\x03\x1f", "\x7f\x80\x81\x9f", "\x85 next line", "bell\x07 esc\x1b[31mred\x1b[0m",
    "\u200b zero width \u200c\u200d", "\ufeff BOM", "\u2028 line sep \u2029 para sep", "\ufffd replacement",
]
WHITESPACE = [
    " ", "  ", "   hello", "hello   ", "hello   world", "\t", "\t\tx", "\n", "\n\n", "\n\n\n\nx", "\r\n", "a\r\nb",
    " \n \n ", "a \n b", "x\t \ty", "   \t\n\r  end", "\u00a0nbsp\u00a0\u00a0x", "ideographic\u3000space",
    " " * 30 + "x", "\n" * 25, "\t \t \t", "trailing space ", " leading", "two  spaces  between",
    "mixed \u2003em\u2002en\u2009thin space", "\x0b vertical tab \x0c form feed", "   ", "\r", "\r\r\n\n",
]
CONTRACTIONS = [
    "it's", "IT'S", "It'S", "don't", "DON'T", "Don'T", "we're", "WE'RE", "we've", "WE'VE", "I'm", "I'M",
    "you'll", "YOU'LL", "You'Ll", "he'd", "HE'D", "it’s", "don’t", "we’re", "I’m", "you’ll", "he’d",
    "'s'", "''s", "'ss", "'llama", "rock 'n' roll", "the '90s", "O'Neil's", "y'all'd've",
]
DIGITS = [
    "0123456789", "3.14159265358979", "1,000,000", "-42", "1e-10", "٠١٢٣٤٥٦٧٨٩", "۰۱۲۳۴۵۶۷۸۹", "०१२३४५६७८९",
    "০১২৩৪৫৬৭৮৯", "๐๑๒๓๔๕๖๗๘๙", "０１２３４５６７８９", "²³¹⁰", "½¾⅓", "ⅠⅡⅢⅫ", "①②③", "𝟘𝟙𝟚",
    "12345678901234567890123456789012345678901234567890", "2022-11-30T07:53:45Z", "v1.2.3-rc.4", "0x1F 0b1010 0o777",
]
CODE = [
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { a[i] = b[i] * c; }",
    '{"key": [1, 2.5, null, true], "nested": {"a": "b"}}',
    "<html><body class=\"main\"><p>Hello &amp; welcome</p></body></html>",
    r"^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@(?:[a-z0-9-]+\.)+[a-z]{2,}$",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "if __name__ == \"__main__\":\n\tmain()\n",
    "x=>x*2; let y = `template ${x}`;",
    "fn main() -> Result<(), Box<dyn Error>> { println!(\"{:?}\", v); Ok(()) }",
    "    \n        indented\n\t\tmixed indent\n",
    "#include <stdio.h>\nint main(void){printf(\"%d\\n\",42);}",
    "$ ls -la | grep '^d' && echo \"done\" > /dev/null 2>&1",
]
URLS = [
    "https://www.example.com/path/to/page?query=1&b=two#frag",
    "http://127.0.0.1:8080/gpt-2/models/124M/model.ckpt.index",
    "mailto:someone@example.org", "ftp://files.example.net/pub/file-v2.tar.gz",
    "https://ja.wikipedia.org/wiki/日本語", "www.EXAMPLE.com/CamelCase_Path-with-dashes",
]
LONG = [
    "a" * 1000, "pneumonoultramicroscopicsilicovolcanoconiosis" * 20, "ab" * 600, "x" * 5000,
    "antidisestablishmentarianism", "Donaudampfschifffahrtsgesellschaftskapitänswitwe",
    "9" * 300, "!" * 500, "-" * 200 + ">", "漢" * 400, "🤗" * 100, "\u0301" * 50,
]
SPECIAL = [
    "<|endoftext|>", "a<|endoftext|>b", "<|endoftext|><|endoftext|>", " <|endoftext|> ", "<|endoftext",
    "endoftext|>", "<|startoftext|>", "Text.<|endoftext|>\n\nNext document.",
]
SURROGATES = ["lone \ud800 high", "\udfff", "a\udc80b"]


def random_texts(rng, n):
    pools = [
        "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " \t\n\r ",
        ".,;:!?'\"()[]{}<>-_/\\@#$%^&*+=~`|", "αβγδεζηθ", "абвгдежз", "你好世界中文字", "ひらがなカタカナ",
        "مرحبا", "नमस्ते", "🤗👍🏽👩‍💻", "\u0301\u0308", "\x00\x01\x7f\x85", "’‘“”", "٠١٢०१२",
    ]
    out = []
    for _ in range(n):
        k = rng.randint(1, 5)
        chosen = rng.sample(pools, k)
        out.append("".join(rng.choice(rng.choice(chosen)) for _ in range(rng.randint(1, 60))))
    return out


def main():
    enc = reference_encoding()
    cases = []
    for group, texts in [("script", list(SCRIPTS.values())), ("emoji", EMOJI), ("combining", COMBINING),
                         ("control", CONTROL), ("whitespace", WHITESPACE), ("contraction", CONTRACTIONS),
                         ("digits", DIGITS), ("code", CODE), ("url", URLS), ("long", LONG),
                         ("special-as-text", SPECIAL), ("surrogate", SURROGATES), ("unicode-edges", UNICODE_EDGES),
                         ("random", random_texts(random.Random(1234), 80))]:
        for text in texts:
            cases.append({"group": group, "text": text, "ids": enc.encode_ordinary(text)})
    for text in SPECIAL:
        cases.append({"group": "special-allowed", "text": text,
                      "ids": enc.encode(text, allowed_special={"<|endoftext|>"})})
    with open(os.path.join(HERE, "bpe_golden.json"), "w", encoding="utf-8") as f:
        json.dump({"reference": f"tiktoken {tiktoken.__version__}, gpt2 encoding from data/gpt2-vocab",
                   "cases": cases}, f, ensure_ascii=True, indent=0)
    print(len(cases), "cases")


if __name__ == "__main__":
    main()
