"""`eagle-zoo diagnose`: where an EAGLE-3 head's drafts fail on the target's own answers.

For each prompt set (jsonl rows with "prompt" or "turns"; the packaged MT-bench copy by
default) the target answers greedily (chat template, fp32), then one teacher-forced pass
replays the drafting chain as training does (``eagle3.ttt_steps_forward``): chain i
starts from the target's features at answer index i, and its step s predicts token
i+s+2. Reported per step: accuracy over every answer position (``acc``), the share of
positions whose target token is in the draft vocabulary (``in vocab``), the accuracy on
those (``acc | in vocab``, what training measures), and ``chain``, the share of chains
whose steps 0..s are all right: the per-position acceptance rates of a k = 3 chain
drafted from every position.

The engine drafts only from where its previous step ended (after the accepted drafts
and the target's own token), so ``along the engine's walk`` takes the chains in that
order; its mean acceptance length matches what `eagle-zoo bench` measures on the same
prompts. Misses come in runs, so a step that starts right after a miss misses more often
than the average position: that is the gap between the two means. Finally step 0 by bins
of the target's probability of its own token: if a head does equally well in each bin on
two sets, the set with more uncertain positions loses by its nature, not for want of a
kind of training data.
"""
from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import torch

BINS = (0.0, 0.3, 0.5, 0.7, 0.9, 1.0001)
STEPS = 3


def read_rows(path: str, num: int) -> tuple[str, list[dict]]:
    """-> (the set's name, its rows as eagle_zoo.bench reads them, each with a category:
    the row's, else the set's name)."""
    from eagle_zoo.bench import load_prompt_rows

    name = path if path in ("mt-bench", "dev") else Path(path).stem
    return name, [{**row, "category": row["category"] or name} for row in load_prompt_rows(path, num)]


@torch.no_grad()
def replay(target, head, ids: torch.Tensor, start: int, aux_ids) -> dict[str, torch.Tensor]:
    """One sequence [T]: per chain start i (predicting answer tokens), the target's
    token and its probability at each step's position, and the head's token per step."""
    from eagle_zoo.train.eagle3 import ttt_steps_forward

    T = ids.numel()
    x = ids.view(1, T)
    hidden, aux = target(x, torch.arange(T).view(1, T), aux_ids)
    probs = torch.softmax(target.compute_logits(hidden)[0].float(), -1)
    p_top, top = probs.max(-1)  # index j: the target's next token after x_j, and its probability
    n = T - 1
    feats = head.combine_hidden_states(torch.cat(aux, -1))[:, :n]
    drafted = []
    for _, h in ttt_steps_forward(head, x, feats, STEPS):
        d = head.compute_draft_logits(h[0]).argmax(-1)
        drafted.append(d + head.d2t[d])  # draft id -> target id
    # chain i, step s predicts x_{i+s+2} = top[i+s+1]; keep chains whose every step is an answer token
    first = max(start - 1, 0)  # the first answer token comes from the prefill, never from a draft
    last = n - STEPS  # chain i's last step reads top[i+STEPS]
    if last <= first:
        return {}
    chains = torch.arange(first, last)
    return {
        "target": torch.stack([top[chains + s + 1] for s in range(STEPS)], 1),
        "p": torch.stack([p_top[chains + s + 1] for s in range(STEPS)], 1),
        "draft": torch.stack([drafted[s][chains] for s in range(STEPS)], 1),
    }


def walk(part: dict) -> torch.Tensor:
    """(tokens, steps) of greedy chain decoding over one answer, as the engine goes: a step
    from position c accepts the leading right drafts (a) plus one token of the target's,
    and the next step starts a + 1 further on. Chains start only where the last one
    ended, so positions after a miss weigh more than in the every-position average."""
    ok = (part["draft"] == part["target"]).long().cumprod(1).sum(1).tolist()
    c, tokens, steps = 0, 0, 0
    while c < len(ok):
        tokens, steps, c = tokens + ok[c] + 1, steps + 1, c + ok[c] + 1
    return torch.tensor([tokens, steps], dtype=torch.float64)


def confident_misses(parts: list[dict], t2d: torch.Tensor, tokenizer, top: int) -> None:
    """The target's tokens the head misses most where the target gives them >= 0.9 and
    the draft vocabulary holds them: what the head does not know that the target does."""
    pairs = Counter()
    for part in parts:
        target, draft, p = part["target"][:, 0], part["draft"][:, 0], part["p"][:, 0]
        miss = (p >= 0.9) & t2d[target] & (draft != target)
        pairs.update(zip(target[miss].tolist(), draft[miss].tolist()))
    total = sum(pairs.values())
    shown = ", ".join(f"{tokenizer.decode([t])!r} (drafted {tokenizer.decode([d])!r}) {n}"
                      for (t, d), n in pairs.most_common(top))
    print(f"  confident misses (p >= 0.9, in vocabulary): {total}; most frequent: {shown}")


def out_of_vocab(parts: list[dict], t2d: torch.Tensor, tokenizer, top: int) -> None:
    """The target's step-0 tokens the draft vocabulary lacks (misses whatever the head
    does), most frequent first: common pieces a larger or other vocabulary would hold, or
    a long tail of rare words no vocabulary of its size will."""
    tokens = torch.cat([part["target"][:, 0] for part in parts])
    missing = Counter(tokens[~t2d[tokens]].tolist())
    total, distinct = sum(missing.values()), len(missing)
    top_tokens = missing.most_common(top)
    shown = ", ".join(f"{tokenizer.decode([t])!r} {n}" for t, n in top_tokens)
    print(f"  out of the draft vocabulary: {total} of {tokens.numel()} positions, {distinct} distinct tokens "
          f"({sum(n for _, n in top_tokens)} positions in the {len(top_tokens)} most frequent); "
          f"most frequent: {shown}")


def report(name: str, parts: list[dict], t2d: torch.Tensor) -> None:
    target = torch.cat([part["target"] for part in parts])
    p = torch.cat([part["p"] for part in parts])
    ok = torch.cat([part["draft"] for part in parts]) == target
    inv = t2d[target]
    chain = ok.float().cumprod(1).mean(0)
    walked = sum((walk(part) for part in parts), torch.zeros(2))
    print(f"\n{name}: {target.shape[0]} chain starts")
    print("  step  acc    in vocab  acc | in vocab  chain")
    for s in range(STEPS):
        print(f"  {s}     {ok[:, s].float().mean():.3f}  {inv[:, s].float().mean():.3f}     "
              f"{ok[inv[:, s], s].float().mean():.3f}         {chain[s]:.3f}")
    print(f"  acceptance length (k = {STEPS}) from every position: {1 + float(chain.sum()):.3f}; "
          f"along the engine's walk: {float(walked[0] / walked[1]):.3f} ({int(walked[1])} steps)")
    print("  step 0 by the target's probability of its token:")
    for lo, hi in zip(BINS[:-1], BINS[1:]):
        m = (p[:, 0] >= lo) & (p[:, 0] < hi)
        if m.any():
            print(f"    p in [{lo:.1f}, {min(hi, 1.0):.1f}): {m.float().mean():6.1%} of positions, "
                  f"acc {ok[m, 0].float().mean():.3f}, acc | in vocab {ok[m & inv[:, 0], 0].float().mean():.3f}")
    print(f"  mean target probability {p[:, 0].mean():.3f}; positions with p >= 0.9: {(p[:, 0] >= 0.9).float().mean():.1%}")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--head", default="eagle-zoo/EAGLE3-SmolLM2-135M-Instruct",
                    help="EAGLE-3 head for the default target: catalog id, hub id or directory "
                         "(default: %(default)s)")
    ap.add_argument("--prompts", nargs="+", default=["mt-bench"],
                    help="prompt sets: jsonl files with a \"prompt\" or \"turns\" per row, or mt-bench "
                         "(the packaged MT-bench first turns; the default)")
    ap.add_argument("--num", type=int, default=80, help="prompts per set (default: %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=256, help="answer length (default: %(default)s)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    ap.add_argument("--by-category", action="store_true", help="a report per category as well")
    ap.add_argument("--misses", type=int, default=0, metavar="N",
                    help="also the N most frequent misses where the target is sure (p >= 0.9)")
    ap.add_argument("--out-of-vocab", type=int, default=0, metavar="N",
                    help="also the N most frequent answer tokens the draft vocabulary lacks")


def run(args: argparse.Namespace) -> int:
    if args.num < 1 or args.max_tokens < 1:
        raise SystemExit("eagle-zoo diagnose: --num and --max-tokens must be at least 1")

    from eagle_zoo import load
    from eagle_zoo.bench import DEFAULT_TARGET
    from eagle_zoo.engine.llm import LLM
    from eagle_zoo.engine.sampling_params import SamplingParams
    from eagle_zoo.models.heads import cfg

    llm = LLM(model=DEFAULT_TARGET, device=args.device, dtype="float32", max_num_seqs=args.num)
    target = llm.engine.target
    head = load(args.head, target=target, dtype=torch.float32).head
    if getattr(head, "t2d", None) is None:
        raise SystemExit(f"eagle-zoo diagnose: --head {args.head}: not an EAGLE-3 head with a draft vocabulary "
                         "(no t2d); pass an EAGLE-3 head")
    aux_ids = list(cfg(head.config, "eagle_aux_hidden_state_layer_ids"))
    t2d = head.t2d.cpu()
    for path in args.prompts:
        name, rows = read_rows(path, args.num)
        outs = llm.chat([r["messages"] for r in rows],
                        SamplingParams(temperature=0, max_tokens=args.max_tokens))
        by_cat: dict[str, list[dict]] = {}
        for r, o in zip(rows, outs):
            ids = torch.tensor(list(o.prompt_token_ids) + list(o.outputs[0].token_ids), device=args.device)
            part = replay(target, head, ids, len(o.prompt_token_ids), aux_ids)
            if part:
                by_cat.setdefault(r["category"], []).append({k: v.cpu() for k, v in part.items()})
        every = [part for parts in by_cat.values() for part in parts]
        report(name, every, t2d)
        if args.misses:
            confident_misses(every, t2d, llm.tokenizer, args.misses)
        if args.out_of_vocab:
            out_of_vocab(every, t2d, llm.tokenizer, args.out_of_vocab)
        if args.by_category and len(by_cat) > 1:
            for cat, parts in by_cat.items():
                report(f"{name} / {cat}", parts, t2d)
                if args.out_of_vocab:
                    out_of_vocab(parts, t2d, llm.tokenizer, args.out_of_vocab)
    return 0
