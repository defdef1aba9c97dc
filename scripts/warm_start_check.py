"""Where a warm start begins: an EAGLE-3 head's losses and accuracies on training data
before any step (the trainer's held-out measurement, over all of the data), with the
head's own draft vocabulary and with one chosen again from the data
(--reselect-draft-vocab); then how far the head's trained lm_head rows have drifted from
the target's rows of the same tokens (mean cosine). A warm start should begin where the
init head is: one that starts far below it spends the run repairing the head.

    eagle-zoo train data --target smollm2 --prompts ../shared/data/train_prompts.jsonl \\
        --max-prompts 32 --max-new-tokens 64 --device cpu --out /tmp/ws-data
    .venv/bin/python scripts/warm_start_check.py --data /tmp/ws-data [--head DIR_OR_ID]

Against the code before the reselected rows were mapped (docs/training.md's 0.070):
    git worktree add /tmp/old 594ffa8 && cp scripts/warm_start_check.py /tmp/ws.py
    (cd /tmp/old && PYTHONPATH=/tmp/old $OLDPWD/.venv/bin/python /tmp/ws.py --data /tmp/ws-data)
"""
from __future__ import annotations

import argparse

SEQUENCES_PER_BATCH = 16


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

    init = None
    for label, reselect in [("own vocabulary", False), ("--reselect-draft-vocab", True)]:
        s = TrainSettings(method="eagle3", target=args.target, data=args.data, steps=1, max_len=1024,
                          ttt_steps=args.ttt_steps, init_from=args.head, reselect_draft_vocab=reselect,
                          device="cpu", progress=False)
        t = Trainer(s, log=lambda *a: None)
        # every sequence is measured, as the held-out ones are
        t.val_index = t.index
        t.val_batches = [list(range(i, min(i + SEQUENCES_PER_BATCH, len(t.index))))
                         for i in range(0, len(t.index), SEQUENCES_PER_BATCH)]
        m = t.evaluate()
        if init is None:
            init = load(args.head, target=t.target.model, dtype=torch.float32, device="cpu").head
        ids = torch.arange(t.head.draft_vocab_size) + t.head.d2t.cpu()
        new = int((~init.t2d[ids]).sum())
        accs = " ".join(f"{k} {v:.3f}" for k, v in sorted(m.items()) if k.startswith("acc"))
        print(f"{label:24s} loss {m['loss']:.3f} | {accs} | {new} of {len(ids)} draft tokens new")
    ids = torch.arange(init.draft_vocab_size) + init.d2t
    cos = torch.nn.functional.cosine_similarity(init.lm_head.weight, t.target.model.lm_head.weight[ids].float(), dim=1)
    print(f"mean cosine between the head's lm_head rows and the target's rows of its tokens: {cos.mean():.3f}")


if __name__ == "__main__":
    main()
