"""Self-instruct prompts: the target writes the user turns itself.

A chat model that is fed its chat template up to the start of a user turn (and
nothing after it) continues with a plausible user message, ending it with the turn's
end token. Sampling that prefix many times gives prompts spread like the requests
the model was tuned on (the idea published as "Magpie", Xu et al. 2024). For a draft
head this widens the training distribution beyond a fixed prompt file (math, code,
role play) towards the general chat and writing questions benchmarks such as MT-bench
ask, without using any benchmark question.

    eagle-zoo train prompts --target smollm2 --num 20000 --out synth.jsonl

Output: JSON lines {"id", "source": "self-instruct", "prompt"} that `eagle-zoo train
data --prompts` reads. Kept: messages that ended with an EOS (not cut by the length
limit), have at least ``min_words`` words, and are new (case- and space-insensitive).

Openers (``--openers "Explain,Write a,Compare"``) start the user message with words of
your choosing, a different one for each row in turn: the model completes the request
(the opener stays in the prompt). Without them the target writes what it was tuned on
most, mostly advice and planning requests for SmolLM2; openers such as "Explain" or
"Write" steer it towards explanations and writing tasks. An opener of ``*`` is a free
row (no opener: the target's own first word), so ``"*,Explain,*,Write a"`` keeps half the
rows of the kind the target writes unsteered: a head trained on steered rows alone loses
acceptance on those.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

_SENTINEL = "\u2063EAGLE_ZOO_USER_TURN\u2063"  # text no real message contains
FREE_ROW = "*"  # an opener that adds nothing: the row starts with the target's own first word


def user_turn_prefix(tokenizer) -> list[int]:
    """Token ids of the chat template up to where a user message's text starts
    (with the template's default system prompt, if it has one)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("self-instruct prompts need a target with a tokenizer and a chat template")
    text = tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}], tokenize=False,
                                         add_generation_prompt=False)
    cut = text.find(_SENTINEL)
    if cut <= 0:
        raise ValueError("the target's chat template does not place the user message in its text; "
                         "self-instruct prompts cannot be made for it")
    return tokenizer.encode(text[:cut], add_special_tokens=False)


@dataclass
class SynthesizeSettings:
    num: int = 10000
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    batch_size: int = 1024
    min_words: int = 3
    seed: int = 0
    max_seconds: Optional[float] = None
    openers: tuple = ()  # words each user message starts with, one per row in turn


def clean_message(text: str, min_words: int) -> Optional[str]:
    """The user message, or None when it is too short to be a request."""
    text = text.strip()
    return text if len(text.split()) >= min_words else None


def synthesize_prompts(target: str, s: SynthesizeSettings, device: torch.device, dtype: torch.dtype,
                       log=print) -> tuple[list[dict], dict]:
    """-> (records, stats). Generates batches of user turns until ``s.num`` distinct
    usable ones exist, the time budget is spent, or a batch adds nothing new."""
    from ..engine.llm import _eos_token_ids
    from ..engine.model_loader import load_model
    from .generate import generate_batch

    start = time.monotonic()
    loaded = load_model(target, dtype, device, tokenizer_required=True)
    tokenizer = loaded.tokenizer
    prefix = user_turn_prefix(tokenizer)
    openers = [[] if o == FREE_ROW else tokenizer.encode(o, add_special_tokens=False) for o in s.openers]
    if any(not ids for o, ids in zip(s.openers, openers) if o != FREE_ROW):
        raise ValueError(f"--openers {','.join(s.openers)!r}: an opener encodes to no tokens; drop empty ones "
                         f"(an unsteered row is {FREE_ROW!r})")
    eos = _eos_token_ids(loaded.path, loaded.config, tokenizer)
    generator = torch.Generator(device=device).manual_seed(s.seed)
    records, seen = [], set()
    stats = {"generated": 0, "unfinished": 0, "too_short": 0, "duplicates": 0, "stopped_by_time_budget": False}
    while len(records) < s.num:
        # The budget counts from the start (model load included) but never stops the first batch.
        if stats["generated"] and s.max_seconds is not None and time.monotonic() - start > s.max_seconds:
            stats["stopped_by_time_budget"] = True
            break
        rows = min(s.batch_size, max(1, s.num - len(records)) * 2)  # some are dropped below
        firsts = [openers[(stats["generated"] + r) % len(openers)] for r in range(rows)] if openers else [[]] * rows
        answers = generate_batch(loaded.model, [prefix + first for first in firsts], max_new_tokens=s.max_new_tokens,
                                 eos_token_ids=eos, temperature=s.temperature, top_p=s.top_p,
                                 generator=generator, device=device, dtype=dtype)
        before = len(records)
        for first, ids in zip(firsts, answers):
            stats["generated"] += 1
            if not ids or ids[-1] not in eos:
                stats["unfinished"] += 1
                continue
            message = clean_message(tokenizer.decode(first + ids[:-1], skip_special_tokens=True), s.min_words)
            if message is None:
                stats["too_short"] += 1
                continue
            key = " ".join(message.lower().split())
            if key in seen:
                stats["duplicates"] += 1
                continue
            seen.add(key)
            records.append({"id": f"self-instruct-{len(records)}", "source": "self-instruct", "prompt": message})
            if len(records) >= s.num:
                break
        log(f"{len(records)} prompts ({stats['generated']} generated, {stats['unfinished']} unfinished, "
            f"{stats['too_short']} too short, {stats['duplicates']} duplicates), {time.monotonic() - start:.0f} s")
        if len(records) == before:
            log("a whole batch added no new prompt: stopping (raise --temperature for more variety)")
            break
    stats["seconds"] = round(time.monotonic() - start, 1)
    return records, stats


def write_prompts(records: list[dict], out) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    tmp.replace(out)
    return out


def interleave(*sources: list[dict], take: Optional[list[int]] = None) -> list[dict]:
    """Round-robin merge (a, b, a, b, ...; with ``take`` = [2, 1]: a, a, b, a, a, b, ...),
    so a time-boxed pass over the result sees every source in the same proportion. A
    source that runs out drops out; the others go on."""
    take = list(take) if take is not None else [1] * len(sources)
    if len(take) != len(sources) or any(t < 1 for t in take):
        raise ValueError(f"take {take}: one count >= 1 per source ({len(sources)})")
    out, iters = [], [(iter(s), t) for s, t in zip(sources, take)]
    while iters:
        alive = []
        for it, t in iters:
            items = [item for item in (next(it, None) for _ in range(t)) if item is not None]
            out.extend(items)
            if len(items) == t:
                alive.append((it, t))
        iters = alive
    return out
