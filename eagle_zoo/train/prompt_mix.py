"""Broad training prompts and the held-apart dev set, built from openly licensed sources.

    eagle-zoo train mix --sources plugins/eagle-zoo-smollm2-heads/training-data \\
        --train-out train.jsonl --dev-out dev.jsonl

A draft head is only as general as the prompts its training answers were written for.
This module turns the raw material of a sources directory (its README records where
each file comes from and its license) into prompts of eleven categories: multi-turn
chat, writing, roleplay, coding, math, extraction, classification, translation,
summarization of long passages, closed-book QA and question answering over retrieved
passages. The target writes every answer later (`eagle-zoo train data`).

The dev set and the training prompts never share a source record: every record is
assigned to one side by a hash of its source and id (``dev_side``), and a prompt built
from several records (retrieved passages) draws them from one side only. The dev set is
what heads, k and training settings are chosen on; benchmarks are measured afterwards
and never used to choose.

Benchmark prompts are refused: a source whose name is a benchmark's (``BENCHMARK_SOURCES``)
stops the build, and so does any prompt that holds an MT-bench question
(``BenchmarkGuard``), the benchmark shipped with the package.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import random
import re
import unicodedata
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterable, Optional

LONG_CATEGORIES = ("summarization", "retrieval_qa")  # prompts of 1-3.5k tokens
CATEGORIES = ("chat", "writing", "roleplay", "coding", "math", "extraction", "classification",
              "translation", "summarization", "closed_qa", "retrieval_qa")

# Source names of benchmarks a head must never train or be selected on. A sources file
# whose rows name one of these stops the build.
BENCHMARK_SOURCES = ("mt-bench", "mt_bench", "spec-bench", "gsm8k-test", "cnn_dailymail", "cnn-dailymail", "xsum",
                     "wmt", "newstest", "natural-questions", "natural_questions", "nq-open", "triviaqa", "humaneval")

# Licenses of the rows of train_prompts.jsonl.gz, which carry a source but no license.
SOURCE_LICENSES = {"gsm8k-train": "MIT", "gpteacher-codegen": "MIT", "gpteacher-roleplay": "MIT"}

LANGUAGES = {"de": "German", "fr": "French", "es": "Spanish", "zh": "Chinese", "ru": "Russian",
             "pt": "Portuguese", "it": "Italian", "ja": "Japanese", "en": "English"}
PROGRAMMING_LANGUAGES = ("Python", "JavaScript", "Rust", "Go", "C++", "Java", "TypeScript", "C#")
DOMAIN_LABELS = {"narrative": "fiction", "nonfiction-economics": "economics", "technical": "technical documentation",
                 "nonfiction-memoir": "memoir", "nonfiction-philosophy": "philosophy", "news": "news",
                 "encyclopedic": "encyclopedia article", "news-interview": "interview", "academic": "academic paper",
                 "travel-guide": "travel guide", "legal": "legal text"}

FOLLOW_UPS = ("Can you explain that in more detail?", "Why is that?", "How sure are you about that, and why?",
              "Can you give me some background on this?", "Summarize what you just said in one sentence.",
              "What else should I know about this topic?", "Can you put that in simpler words for a child?",
              "Give me two related questions I could ask next, and answer them.")
WRITING_KINDS = ("a short blog post", "a poem", "a short story", "a persuasive essay introduction", "a formal letter",
                 "a speech for a school assembly", "a product description", "a haiku sequence", "a news-style report",
                 "a diary entry", "a dialogue between two friends", "an advertisement")
EXTRACTION_TASKS = (
    "List every person mentioned in the text below, with one line each saying who they are.",
    "Extract all the places and dates mentioned in the text below as a JSON object with keys \"places\" and "
    "\"dates\".",
    "Return a JSON object with the keys \"main_topic\", \"people\", \"organizations\" and \"key_facts\" for the "
    "text below.",
    "Extract the three most important claims made in the text below as a numbered list.",
    "Pull out every number in the text below and say what it refers to, as a table.",
)
SUMMARY_TASKS = ("Summarize the following text in one paragraph.", "Write a five-point bullet summary of the text "
                 "below.", "Summarize the following passage for a busy reader in about 100 words.",
                 "What are the main ideas of the text below? Summarize them briefly.")


@dataclass(frozen=True)
class MixSettings:
    seed: int = 0
    dev_percent: int = 8         # share of source records (per hash) set apart for the dev set
    dev_per_category: int = 30   # dev prompts per category (11 categories: 330 prompts)
    max_long_words: int = 2600   # longest long-context prompt (~3.5k SmolLM2 tokens)
    min_long_words: int = 700    # shortest summarized text (~1k tokens)


def dev_side(source: str, record_id, dev_percent: int) -> bool:
    """True when the record belongs to the dev set's side: a stable hash, independent of
    file order, seeds and settings other than the share."""
    digest = hashlib.sha256(f"{source}\x00{record_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < dev_percent


def normalize(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(re.findall(r"\w+", text))


class BenchmarkGuard:
    """Refuses prompts that hold a benchmark question (MT-bench's, shipped as package data):
    a prompt is refused when its normalized text contains a normalized benchmark question."""

    def __init__(self, questions: Optional[Iterable[str]] = None):
        if questions is None:
            text = resources.files("eagle_zoo").joinpath("data/mt_bench.jsonl").read_text()
            questions = [turn for line in text.splitlines() if line.strip() for turn in json.loads(line)["turns"]]
        self.questions = [q for q in (normalize(q) for q in questions) if len(q.split()) >= 4]

    def check(self, prompt_text: str) -> Optional[str]:
        """The benchmark question the text holds, or None."""
        norm = normalize(prompt_text)
        return next((q for q in self.questions if q in norm), None)


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_sources(directory) -> dict[str, list[dict]]:
    """The four source files of a sources directory, each row with its license."""
    directory = Path(directory)
    files = {"prompts": "train_prompts.jsonl.gz", "questions": "questions.jsonl.gz",
             "sentences": "multilingual_sentences.jsonl.gz", "passages": "long_passages.jsonl.gz"}
    out = {}
    for key, name in files.items():
        path = directory / name
        if not path.is_file():
            raise FileNotFoundError(f"--sources {directory}: {name} is missing (the sources README lists the files)")
        rows = _read_jsonl(path)
        for n, row in enumerate(rows, 1):
            source = str(row.get("source", ""))
            if any(b in source.lower() for b in BENCHMARK_SOURCES):
                raise ValueError(f"{path} line {n}: source {source!r} is a benchmark; benchmark prompts never "
                                 "train or select a head (remove these rows)")
            if "license" not in row:
                if source not in SOURCE_LICENSES:
                    raise ValueError(f"{path} line {n}: source {source!r} has no license recorded (add a 'license' "
                                     "field or an entry in SOURCE_LICENSES)")
                row["license"] = SOURCE_LICENSES[source]
        out[key] = rows
    return out


def _words(text: str) -> int:
    return len(text.split())


def _cut_words(text: str, limit: int) -> str:
    """The text's leading paragraphs, up to ``limit`` words (at least the first paragraph, cut)."""
    kept, count = [], 0
    for para in text.split("\n\n"):
        n = _words(para)
        if count + n > limit:
            if not kept:
                kept.append(" ".join(para.split()[:limit]))
            break
        kept.append(para)
        count += n
    return "\n\n".join(kept)


def _keyword(text: str, rng: random.Random) -> Optional[str]:
    """A capitalized name the passage mentions at least twice (not at a sentence start only)."""
    names = re.findall(r"(?<=[a-z,;] )([A-Z][a-z]{3,}(?: [A-Z][a-z]{2,})?)", text)
    counts = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    frequent = sorted(n for n, c in counts.items() if c >= 2)
    return rng.choice(frequent) if frequent else None


def _record(category: str, sources: list[tuple[str, object, str]], prompt=None, messages=None) -> dict:
    rec = {"category": category}
    if messages is not None:
        rec["messages"] = messages
    else:
        rec["prompt"] = prompt
    rec["sources"] = [{"source": s, "id": i, "license": lic} for s, i, lic in sources]
    return rec


def _src(row: dict, id_key: str = "id") -> tuple[str, object, str]:
    return (row["source"], row[id_key], row["license"])


# -- one builder per category: rows of one side in, prompt records out -------------------------
def build_chat(q: list[dict], s: list[dict], rng: random.Random) -> list[dict]:
    out = []
    for row in q:
        if row["type"] == "coding" or not row.get("answer"):
            continue
        answer = row["answer"] if row["type"] == "factual" else f"The answer is {row['answer']}."
        out.append(_record("chat", [_src(row)], messages=[
            {"role": "user", "content": row["question"]}, {"role": "assistant", "content": answer},
            {"role": "user", "content": rng.choice(FOLLOW_UPS)}]))
    for row in s:
        if row.get("en") and row["lang"] != "en":
            other = rng.choice([c for c in ("de", "fr", "es", "it", "pt") if c != row["lang"]])
            out.append(_record("chat", [_src(row)], messages=[
                {"role": "user", "content": f"What does this {LANGUAGES[row['lang']]} sentence mean?\n\n{row['text']}"},
                {"role": "assistant", "content": row["en"]},
                {"role": "user", "content": f"Thanks. How would you say it in {LANGUAGES[other]}?"}]))
    return out


def build_writing(passages: list[dict], q: list[dict], rng: random.Random) -> list[dict]:
    out = []
    for row in passages:
        title = row["title"].strip()
        if 2 <= _words(title) <= 16:
            out.append(_record("writing", [_src(row)],
                               prompt=f"Write {rng.choice(WRITING_KINDS)} inspired by this title: \"{title}\"."))
    for row in q:
        if row["type"] == "factual" and row.get("answer"):
            out.append(_record("writing", [_src(row)], prompt=(
                f"Write {rng.choice(WRITING_KINDS)} about {row['answer']}.")))
    return out


def build_roleplay(prompts: list[dict]) -> list[dict]:
    return [_record("roleplay", [_src(r)], prompt=r["prompt"]) for r in prompts if r["source"] == "gpteacher-roleplay"]


def build_coding(prompts: list[dict], q: list[dict], rng: random.Random) -> list[dict]:
    out = [_record("coding", [_src(r)], prompt=r["prompt"]) for r in prompts if r["source"] == "gpteacher-codegen"]
    for row in q:
        if row["type"] == "coding":
            for lang in rng.sample(PROGRAMMING_LANGUAGES, 3):
                out.append(_record("coding", [_src(row)], prompt=f"Solve this in {lang}:\n\n{row['question']}"))
    return out


def build_math(prompts: list[dict], q: list[dict]) -> list[dict]:
    out = [_record("math", [_src(r)], prompt=r["prompt"]) for r in prompts if r["source"] == "gsm8k-train"]
    out += [_record("math", [_src(r)], prompt=r["question"]) for r in q if r["type"] == "math_word_problem"]
    return out


def _paragraph_windows(text: str, low: int, high: int) -> list[str]:
    """Runs of consecutive paragraphs of low..high words."""
    paras = [p for p in text.split("\n\n") if p.strip()]
    out, i = [], 0
    while i < len(paras):
        run, n = [], 0
        while i < len(paras) and n < low:
            run.append(paras[i])
            n += _words(paras[i])
            i += 1
        if low <= n <= high:
            out.append("\n\n".join(run))
    return out


def build_extraction(passages: list[dict], rng: random.Random) -> list[dict]:
    out = []
    for row in passages:
        for window in _paragraph_windows(row["text"], 120, 400):
            out.append(_record("extraction", [_src(row)], prompt=f"{rng.choice(EXTRACTION_TASKS)}\n\n{window}"))
    return out


def build_classification(s: list[dict], passages: list[dict]) -> list[dict]:
    out = []
    for row in s:
        if row["lang"] != "en":
            out.append(_record("classification", [_src(row)], prompt=(
                f"Which language is the following sentence written in? Answer with the language's name, then "
                f"say what the sentence is about in a few words.\n\n{row['text']}")))
    labels = sorted(set(DOMAIN_LABELS.values()))
    for row in passages:
        for window in _paragraph_windows(row["text"], 80, 250)[:3]:
            out.append(_record("classification", [_src(row)], prompt=(
                f"Classify the following text as one of: {', '.join(labels)}. Give the label, then one sentence "
                f"explaining your choice.\n\n{window}")))
    return out


def build_translation(s: list[dict], rng: random.Random) -> list[dict]:
    out = []
    for row in s:
        lang = LANGUAGES[row["lang"]]
        out.append(_record("translation", [_src(row)], prompt=f"Translate this {lang} text into English:\n\n"
                                                              f"{row['text']}"))
        if row.get("en"):
            other = rng.choice([c for c in ("de", "fr", "es", "it", "pt", "zh", "ru") if c != row["lang"]])
            out.append(_record("translation", [_src(row)], prompt=f"Translate into {LANGUAGES[other]}:\n\n"
                                                                  f"{row['en']}"))
    return out


def build_summarization(passages: list[dict], rng: random.Random, st: MixSettings) -> list[dict]:
    """Whole passages, and pairs of consecutive passages of one book, of 1-3.5k tokens."""
    out, previous = [], None
    for row in passages:
        if _words(row["text"]) >= st.min_long_words:
            text = _cut_words(row["text"], st.max_long_words)
            out.append(_record("summarization", [_src(row)], prompt=f"{rng.choice(SUMMARY_TASKS)}\n\n{text}"))
        if previous is not None and previous["source"] == row["source"] and previous["source"].startswith("gutenberg"):
            joined = _cut_words(previous["text"] + "\n\n" + row["text"], st.max_long_words)
            if _words(joined) > 1.5 * st.min_long_words:
                out.append(_record("summarization", [_src(previous), _src(row)],
                                   prompt=f"{rng.choice(SUMMARY_TASKS)}\n\n{joined}"))
        previous = row
    return out


def build_closed_qa(q: list[dict]) -> list[dict]:
    return [_record("closed_qa", [_src(r)], prompt=r["question"]) for r in q if r["type"] == "factual"]


def build_retrieval_qa(passages: list[dict], rng: random.Random, st: MixSettings, count: int) -> list[dict]:
    """Two to four passages as numbered documents and a question about one of them."""
    out = []
    if len(passages) < 2:
        return out
    for _ in range(count):
        docs = rng.sample(passages, rng.randint(2, min(4, len(passages))))
        budget = st.max_long_words // len(docs)
        target = rng.randrange(len(docs))
        keyword = _keyword(_cut_words(docs[target]["text"], budget), rng)
        if keyword is None:
            continue
        body = "\n\n".join(f"[Document {i + 1}] {d['title']}\n{_cut_words(d['text'], budget)}"
                           for i, d in enumerate(docs))
        question = rng.choice((
            f"According to the documents, what is said about {keyword}?",
            f"Which document mentions {keyword}, and in what context? Quote the relevant sentence.",
            f"Using only the documents above, explain who or what {keyword} is and why it matters there.",
        ))
        out.append(_record("retrieval_qa", [_src(d) for d in docs],
                           prompt=f"Answer the question using the documents below.\n\n{body}\n\nQuestion: {question}"))
    return out


def prompt_text(rec: dict) -> str:
    if "prompt_token_ids" in rec:
        return ""
    if "messages" in rec:
        return "\n".join(m["content"] for m in rec["messages"])
    return rec["prompt"]


def build_side(src: dict[str, list[dict]], dev: bool, st: MixSettings, retrieval_count: int) -> dict[str, list[dict]]:
    """Every prompt of one side (dev or train), by category, in a seeded order."""
    def side(rows: list[dict]) -> list[dict]:
        return [r for r in rows if dev_side(r["source"], r["id"], st.dev_percent) == dev]

    p, q, s, passages = (side(src[k]) for k in ("prompts", "questions", "sentences", "passages"))
    rng = random.Random(f"{st.seed}-{'dev' if dev else 'train'}")
    built = {
        "chat": build_chat(q, s, rng), "writing": build_writing(passages, q, rng), "roleplay": build_roleplay(p),
        "coding": build_coding(p, q, rng), "math": build_math(p, q),
        "extraction": build_extraction(passages, rng), "classification": build_classification(s, passages),
        "translation": build_translation(s, rng), "summarization": build_summarization(passages, rng, st),
        "closed_qa": build_closed_qa(q), "retrieval_qa": build_retrieval_qa(passages, rng, st, retrieval_count),
    }
    for rows in built.values():
        rng.shuffle(rows)
    return built


def build_mix(sources_dir, st: MixSettings = MixSettings(), guard: Optional[BenchmarkGuard] = None,
              train_caps: Optional[dict[str, int]] = None,
              extra: Optional[list[list[dict]]] = None) -> tuple[list[dict], list[dict]]:
    """(train prompts, dev prompts). The dev set takes ``dev_per_category`` prompts of each
    category from the dev side; training takes the train side, each category capped by
    ``train_caps`` (default: all), plus the ``extra`` prompt lists (self-instruct prompts the
    target wrote), interleaved so any prefix of the file mixes every category."""
    guard = guard or BenchmarkGuard()
    src = load_sources(sources_dir)
    dev_built = build_side(src, True, st, retrieval_count=4 * st.dev_per_category)
    train_built = build_side(src, False, st, retrieval_count=(train_caps or {}).get("retrieval_qa", 4000))
    dev = [rec for cat in CATEGORIES for rec in dev_built[cat][:st.dev_per_category]]
    train_lists = [train_built[c][:(train_caps or {}).get(c)] for c in CATEGORIES] + list(extra or [])
    train = _interleave(train_lists)
    for split, rows in (("dev", dev), ("train", train)):
        for n, rec in enumerate(rows):
            hit = guard.check(prompt_text(rec))
            if hit is not None:
                raise ValueError(f"{split} prompt {n} ({rec.get('category')}, from {rec.get('sources')}) holds the "
                                 f"benchmark question {hit[:60]!r}: benchmark prompts never train or select a head")
            rec["id"] = f"{split}-{n:06d}"
    for cat in CATEGORIES:
        if len(dev_built[cat]) < st.dev_per_category:
            raise ValueError(f"the dev side has {len(dev_built[cat])} {cat} prompts, fewer than "
                             f"{st.dev_per_category}: raise the dev share (MixSettings.dev_percent)")
    return train, dev


def _interleave(lists: list[list[dict]]) -> list[dict]:
    """Round-robin over the lists in proportion to their lengths (a smooth mix of categories)."""
    keyed = [((i + 0.5) / len(l), c, i) for c, l in enumerate(lists) if l for i in range(len(l))]
    keyed.sort()
    return [lists[c][i] for _, c, i in keyed]


def write_jsonl(rows: list[dict], path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
