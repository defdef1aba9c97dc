"""Where a warm start begins: an EAGLE-3 head's losses and accuracies on training data,
measured before any step (the trainer's held-out measurement over all of the data), with
the head's own draft vocabulary and with one chosen again from the data
(--reselect-draft-vocab), the latter also grown to two layers (--head-layers 2).

Last, how far the head's trained lm_head rows have drifted from the target's rows of the
same tokens (mean cosine). A warm start should begin where the init head is: a reselected vocabulary or a grown
layer that starts far below it spends the run repairing the head.

    eagle-zoo train data --target smollm2 --prompts ../shared/data/train_prompts.jsonl \\
        --max-prompts 32 --max-new-tokens 64 --device cpu --out /tmp/ws-data
    .venv/bin/python scripts/warm_start_check.py --data /tmp/ws-data [--head DIR_OR_ID]
"""
from __future__ import annotations

import argparse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", default="eagle-zoo/EAGLE3-SmolLM2-135M-Instruct")
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--data", nargs="+", required=True, help="`eagle-zoo train data` directories")
    ap.add_argument("--ttt-steps", type=int, default=4)
    args = ap.parse_args()

    import torch

    from eagle_zoo import load
    from eagle_zoo.train.trainer import Trainer, TrainSettings

    for label, layers, reselect in [("own vocabulary", 1, False), ("--reselect-draft-vocab", 1, True),
                                    ("--reselect-draft-vocab --head-layers 2", 2, True)]:
        s = TrainSettings(method="eagle3", target=args.target, data=args.data, steps=1, token_budget=4096,
                          max_len=1024, ttt_steps=args.ttt_steps, init_from=args.head, head_layers=layers,
                          reselect_draft_vocab=reselect, device="cpu", progress=False)
        said = []
        t = Trainer(s, log=said.append)
        t.val_index, t.val_batches = t.index, [list(range(len(t.index)))]  # every sequence, as the held-out pass
        m = t.evaluate()
        accs = " ".join(f"{k} {v:.3f}" for k, v in sorted(m.items()) if k.startswith("acc"))
        kept = [line.split(": ", 1)[1].split(", mapped")[0] for line in said if "trained lm_head rows" in line]
        print(f"{label:42s} loss {m['loss']:.3f} | {accs}" + (f" | {kept[0]}" if kept else ""))
    # how far the trained rows have drifted from the target's rows of the same tokens
    head = load(args.head, target=t.target.model, dtype=torch.float32, device="cpu").head
    ids = torch.arange(head.draft_vocab_size) + head.d2t
    cos = torch.nn.functional.cosine_similarity(head.lm_head.weight, t.target.model.lm_head.weight[ids].float(), dim=1)
    print(f"mean cosine between the head's lm_head rows and the target's rows of its tokens: {cos.mean():.3f}")


if __name__ == "__main__":
    main()
