"""The training loop shared by EAGLE-1 and EAGLE-3: target, data, head, AdamW, resume.

Everything a run depends on is a function of the settings and the step: the batch
plan of each epoch comes from (seed, epoch), the input-noise generator's state is
checkpointed, so a run resumed from its state file reproduces the uninterrupted run
exactly on CPU. (With --max-seconds the learning-rate schedule follows the clock
too, which no resume can replay; use --steps when that matters.)
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import torch

from .averaging import WeightAverage, check_decay
from .batching import collate, plan_epoch, usable
from .build import build_head, default_aux_layers, head_config, init_from_head, load_init_head, trainable_parameters
from .data import load_data
from .eagle1 import eagle1_loss
from .eagle3 import eagle3_loss
from .save import read_record
from .validation import split_by_prompt
from .vocab import coverage, select_draft_vocab, token_counts

STATE_FILE = "state.pt"


@dataclass
class TrainSettings:
    method: str  # eagle | eagle3
    target: str
    data: list
    steps: Optional[int] = None  # default: epochs over the data
    epochs: float = 1.0
    max_seconds: Optional[float] = None  # the run's length in time (also the LR schedule's horizon)
    stop_after_seconds: Optional[float] = None  # pause after N s of training in this process (state saved; --resume continues)
    # pause once the clock (Unix seconds) passes this, loads and feature cache included: a job
    # with a hard time limit ends on time however long its start took
    pause_at: Optional[float] = None
    stop_file: Optional[str] = None  # end the run early, as its time budget would, once this file exists
    token_budget: int = 16384
    max_len: int = 2048
    lr: float = 3e-4
    warmup_steps: Optional[int] = None  # default: 5% of the steps, at most 200
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.95)
    grad_clip: float = 0.5
    noise: float = 0.2  # EAGLE-1 input noise
    ttt_steps: Optional[int] = None  # unrolled drafting steps; None: 1 for EAGLE-1 (its recipe), 7 for EAGLE-3
    ttt_decay: float = 0.8
    # EAGLE-3: soft labels softmax(target logits / t); 1 = the published recipe (eagle3.py)
    label_temperature: float = 1.0
    draft_vocab_size: Optional[int] = None  # EAGLE-3; default min(32000, vocab)
    aux_layers: Optional[list] = None
    init_from: Optional[str] = None  # a head to start from (its weights; EAGLE-3: its draft vocab, aux layers)
    # decoder layers of the head; None: init_from's (a warm start continues the head as it is),
    # else 1 (published heads); more than init_from's grows it
    head_layers: Optional[int] = None
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    state_dir: Optional[str] = None
    resume: bool = False
    save_every: int = 500
    log_every: int = 20
    progress: bool = True
    cache_features: bool = False  # the target's features computed once (feature_cache.py), not every step
    reselect_draft_vocab: bool = False  # EAGLE-3 --init-from: draft vocabulary chosen from this run's data
    val_share: float = 0.0  # share of the prompts held out of training and measured (validation.py)
    val_every: int = 500  # steps between measurements of the held-out prompts (and one at the end)
    ema: Optional[float] = None  # save the moving average of the weights with this decay (averaging.py)

    def __post_init__(self):
        if self.ttt_steps is None:  # resolved here, so the run's record holds the value used
            self.ttt_steps = 7 if self.method == "eagle3" else 1
        if not self.label_temperature > 0:
            raise ValueError(f"--label-temperature {self.label_temperature}: give a temperature > 0 "
                             f"(1 = the target's distribution, smaller sharpens it)")
        if self.ema is not None:
            check_decay(self.ema)


@dataclass
class TrainResult:
    head: torch.nn.Module
    flat_config: dict
    target: object  # LoadedModel
    step: int
    history: list = field(default_factory=list)
    info: dict = field(default_factory=dict)


def resolve_device(name: str) -> torch.device:
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: CUDA is not available here; use --device cpu")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if name in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in table:
        raise ValueError(f"--dtype {name!r}: use one of {sorted(table)} or auto")
    return table[name]


def lr_at(s: TrainSettings, step: int, total: int, elapsed: float) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio * lr over the run's progress
    (steps done, or time used when --max-seconds is set, whichever is further)."""
    warmup = s.warmup_steps if s.warmup_steps is not None else min(200, max(1, total // 20))
    if step < warmup:
        return s.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    if s.max_seconds:
        progress = max(progress, elapsed / s.max_seconds)
    progress = min(1.0, progress)
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


class Trainer:
    def __init__(self, s: TrainSettings, log=print):
        from ..engine.model_loader import load_model
        from ..plugins import get_registry

        if s.method not in ("eagle", "eagle3"):
            raise ValueError(f"method {s.method!r}: train 'eagle' or 'eagle3'")
        if s.max_len > s.token_budget:
            raise ValueError(f"--max-len {s.max_len} exceeds --token-budget {s.token_budget}: one sequence must fit a batch")
        self.s, self.log = s, log
        self.device = resolve_device(s.device)
        self.dtype = resolve_dtype(s.dtype, self.device)
        self.autocast = self.device.type == "cuda" and self.dtype != torch.float32
        self.target = load_model(s.target, self.dtype, self.device)
        self.target.model.requires_grad_(False)
        vocab = self.target.config.vocab_size
        self.data = load_data(s.data)
        data_vocab = self.data.meta.get("vocab_size") or max(
            [p.get("vocab_size", 0) for p in self.data.meta.get("parts", [])] or [0])
        if data_vocab and data_vocab != vocab:
            raise ValueError(f"the training data was made for a vocabulary of {data_vocab} tokens, the target "
                             f"{s.target} has {vocab}: regenerate it with `eagle-zoo train data --target {s.target}`")
        self.index = usable(self.data, s.max_len)
        if not self.index.numel():
            raise ValueError(f"{s.data}: no sequence has assistant tokens within --max-len {s.max_len}")
        self.val_index = self.index[:0]
        if s.val_share:
            self.index, self.val_index = split_by_prompt(self.data, self.index, s.val_share, s.seed)
            if not self.index.numel() or not self.val_index.numel():
                raise ValueError(f"--val-share {s.val_share} leaves {self.index.numel()} sequences to train on and "
                                 f"{self.val_index.numel()} held out: give a share that keeps both")
            log(f"{self.val_index.numel()} of {self.index.numel() + self.val_index.numel()} sequences held out "
                f"(--val-share {s.val_share}: their prompts are never trained on)")
        self.val_batches = plan_epoch(self.data.lengths[self.val_index].clamp(max=s.max_len), s.token_budget, s.seed, 0)
        self.val_history: list[dict] = []
        self.lengths = self.data.lengths[self.index].clamp(max=s.max_len)

        draft_ids, self.info, aux_layers, init = None, {}, s.aux_layers, None
        if s.init_from:  # warm start: the weights, draft vocabulary and aux layers of this head
            init = load_init_head(s.init_from, s.method, self.target.model)
            self.info["init_from"] = {"head": _recorded_path(s.init_from), "path": _recorded_path(init.path),
                                      "format": init.format}
            record = read_record(init.path) if init.path else None
            if record is not None:  # how the start was made: a head grown round after round keeps its whole history
                self.info["init_from"]["record"] = record
            log(f"initial weights from {s.init_from} ({init.format}, {init.path})")
        if s.method == "eagle3":
            counts = token_counts(self.data.input_ids, self.data.loss_mask, vocab)
            if init is None:
                draft_ids = select_draft_vocab(counts, s.draft_vocab_size or min(32000, vocab))
            else:
                aux_layers = _init_eagle3_settings(s, init, self.target.config.num_hidden_layers)
                draft_ids = torch.arange(init.head.draft_vocab_size) + init.head.d2t
                if s.reselect_draft_vocab:
                    log(f"--init-from's draft vocabulary covers {coverage(counts, draft_ids):.2%} of the training "
                        f"targets; choosing another from this data (--reselect-draft-vocab)")
                    draft_ids = select_draft_vocab(counts, s.draft_vocab_size or draft_ids.numel())
            self.info["draft_vocab_coverage"] = round(coverage(counts, draft_ids), 4)
            where = " (from --init-from)" if init is not None and not s.reselect_draft_vocab else ""
            log(f"draft vocabulary{where}: {draft_ids.numel()} of {vocab} "
                f"tokens cover {self.info['draft_vocab_coverage']:.2%} of the training targets")
        # a warm start keeps the init head's depth unless told otherwise; a fresh head has one layer
        layers = s.head_layers if s.head_layers is not None else len(init.head.layers) if init is not None else 1
        self.flat_config = head_config(self.target.path, s.method, draft_vocab_size=draft_ids.numel() if draft_ids is not None else None,
                                       aux_layer_ids=aux_layers, num_layers=layers)
        family = get_registry().family_for_config(self.target.config)
        self.mapping = family.weight_mapping
        reselect = init is not None and s.method == "eagle3" and s.reselect_draft_vocab
        self.head = build_head(family, self.flat_config, s.method, self.target.model, s.seed,
                               draft_ids if init is None or reselect else None)
        if init is not None:  # replaces the random init (d2t / t2d and lm_head included, unless reselected)
            init_from_head(self.head, init, s.method, s.init_from, log, keep_draft_vocab=reselect)
            del init
        self.params = trainable_parameters(self.head, s.method)
        self.optimizer = torch.optim.AdamW(list(self.params.values()), lr=s.lr, betas=tuple(s.betas),
                                           weight_decay=s.weight_decay)
        # from the weights training starts from: a warm start stays anchored to its head
        self.average = WeightAverage(self.params, s.ema) if s.ema else None
        self.averaged = False  # the head holds the average (the end of the run), not the last step's weights
        self.noise_gen = torch.Generator(device=self.device).manual_seed(s.seed + 1)
        self.epoch_batches = plan_epoch(self.lengths, s.token_budget, s.seed, 0)
        self.total = s.steps or max(1, round(s.epochs * len(self.epoch_batches)))
        self.step, self.epoch, self.batch_in_epoch, self.elapsed = 0, 0, 0, 0.0
        self.history: list[dict] = []
        self.micro = 1  # row chunks per batch; doubled after a CUDA out-of-memory error
        self.state_path = Path(s.state_dir) / STATE_FILE if s.state_dir else None
        self.features = None
        if s.cache_features:
            from .feature_cache import FeatureCache

            aux_ids = self.flat_config.get("eagle_aux_hidden_state_layer_ids") if s.method == "eagle3" else []
            self.features = FeatureCache(self.target.model, self.data, self.index, s.max_len, aux_ids, self.device,
                                         self.dtype, s.token_budget, self._autocast, log)
        if s.resume:
            self._load_state()

    # -- one optimisation step ------------------------------------------------------
    def _loss(self, batch, noise: Optional[float] = None):
        s = self.s
        unrolled = dict(ttt_steps=s.ttt_steps, decay=s.ttt_decay,
                        cache_dtype=self.dtype if self.autocast else torch.float32)
        with self._autocast():
            if s.method == "eagle":
                return eagle1_loss(self.head, self.target.model, batch, noise=s.noise if noise is None else noise,
                                   generator=self.noise_gen, **unrolled)
            return eagle3_loss(self.head, self.target.model, batch,
                               aux_layer_ids=self.flat_config["eagle_aux_hidden_state_layer_ids"],
                               label_temperature=s.label_temperature, **unrolled)

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.autocast)

    def train_step(self, batch) -> dict:
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.s, self.step, self.total, self.elapsed)
        while True:
            try:
                metrics = self._accumulate(batch)
                break
            except torch.cuda.OutOfMemoryError:
                if self.micro >= batch.input_ids.shape[0]:
                    raise
            # Out of the except block, so the failed attempt's tensors are freed.
            self.optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            self.micro *= 2
            self.log(f"CUDA out of memory: splitting each batch into {self.micro} parts from now on "
                     f"(lower --token-budget to avoid this)")
        grad_norm = torch.nn.utils.clip_grad_norm_(list(self.params.values()), self.s.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.average is not None:
            self.average.update(self.params)
        metrics["grad_norm"] = grad_norm.detach()
        metrics["lr"] = torch.tensor(self.optimizer.param_groups[0]["lr"])
        return metrics

    def _accumulate(self, batch) -> dict:
        B = batch.input_ids.shape[0]
        parts = [batch.rows(slice(i, i + -(-B // self.micro))) for i in range(0, B, -(-B // self.micro))]
        total = max(1, batch.num_loss_tokens())  # host counts (collate's): no device read
        out, tokens = {}, 0
        for part in parts:
            loss, metrics, n = self._loss(part)
            weight = part.num_loss_tokens() / total if len(parts) > 1 else 1.0
            (loss * weight).backward()
            for k, v in metrics.items():
                out[k] = out.get(k, 0) + v * weight
            tokens = tokens + n
        out["tokens"] = torch.as_tensor(tokens).float()  # read back with the log window, not here
        return out

    def evaluate(self) -> dict:
        """The losses and accuracies on the held-out prompts (no input noise), per loss
        token; the weights are not touched."""
        sums, tokens = {}, 0
        with torch.no_grad():
            for positions in self.val_batches:
                batch = collate(self.data, self.val_index[positions].tolist(), self.s.max_len).to(self.device)
                n = batch.num_loss_tokens()
                _, metrics, _ = self._loss(batch, noise=0.0)
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(v) * n
                tokens += n
        return {k: v / max(1, tokens) for k, v in sums.items()}

    def _validate(self, weights: Optional[str] = None) -> None:
        metrics = self.evaluate()
        record = {"step": self.step, "seconds": round(self.elapsed, 1), **{k: round(v, 5) for k, v in metrics.items()}}
        if weights:
            record["weights"] = weights
        self.val_history.append(record)
        accs = " ".join(f"{k} {v:.3f}" for k, v in sorted(metrics.items()) if k.startswith("acc"))
        which = f" ({weights})" if weights else ""
        self.log(f"held out{which} | step {self.step} | loss {metrics['loss']:.4f} | {accs} | "
                 f"{self.val_index.numel()} sequences")

    # -- the loop ------------------------------------------------------------------------
    def next_batch(self):
        """The batch at the current data position (the position advances only when its
        step completes, so an interrupted step is redone on resume)."""
        if self.batch_in_epoch >= len(self.epoch_batches):
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            self.epoch_batches = plan_epoch(self.lengths, self.s.token_budget, self.s.seed, self.epoch)
        positions = self.epoch_batches[self.batch_in_epoch]
        batch = collate(self.data, self.index[positions].tolist(), self.s.max_len).to(self.device)
        if self.features is not None:
            batch.hidden, batch.aux = self.features.gather(positions, batch.input_ids.shape[1])
        return batch

    def run(self) -> TrainResult:
        from tqdm import tqdm

        s = self.s
        self.log(f"training {s.method} on {len(self.index)} sequences, {int(self.lengths.sum()):,} tokens; "
                 f"{len(self.epoch_batches)} batches per epoch; {self.total} steps"
                 + (f" or {s.max_seconds:.0f} s" if s.max_seconds else "") + f"; device {self.device}, {self.dtype}")
        start, window, stop_reason, paused = time.monotonic() - self.elapsed, [], "steps", False
        pause_deadline, pause_option = self._pause_deadline()
        first_step = self.step
        noise_state = self.noise_gen.get_state()
        bar = tqdm(total=self.total, initial=self.step, desc=f"train {s.method}", disable=None if s.progress else True)
        try:
            while self.step < self.total:
                if s.max_seconds and self.elapsed >= s.max_seconds:
                    stop_reason = "time budget"
                    break
                # one stat a step: a job that cannot be signalled (a background process of a
                # script ignores SIGINT) is still ended cleanly from outside, head saved
                if s.stop_file and os.path.exists(s.stop_file):
                    stop_reason = f"--stop-file {s.stop_file}"
                    break
                # never before this process's first step: a job too short for one step would pause forever
                if pause_deadline is not None and self.step > first_step and time.monotonic() >= pause_deadline:
                    stop_reason, paused = f"{pause_option} (continue with --resume)", True
                    break
                noise_state = self.noise_gen.get_state()
                metrics = self.train_step(self.next_batch())
                self.step, self.batch_in_epoch = self.step + 1, self.batch_in_epoch + 1
                self.elapsed = time.monotonic() - start
                window.append(metrics)
                bar.update(1)
                if self.step % s.log_every == 0 or self.step == self.total:
                    self._log_window(window, bar)
                    window = []
                if self.val_batches and s.val_every and self.step % s.val_every == 0:
                    measured = time.monotonic()
                    self._validate()
                    start += time.monotonic() - measured  # the measurement is not training time
                if self.state_path and s.save_every and self.step % s.save_every == 0:
                    self.save_state()
            if self.val_batches and (not self.val_history or self.val_history[-1]["step"] != self.step):
                self._validate()  # where the run ends (before the state is saved, so it keeps this too)
        except BaseException as exc:
            self.noise_gen.set_state(noise_state)  # the state saved is that after the last whole step
            self.log(f"training stopped at step {self.step} by {type(exc).__name__}: {exc}")
            self.info["stopped_by"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            bar.close()
            if window:
                self._log_window(window, None)
            if self.state_path:
                self.save_state()
        self.info.update(stop_reason=stop_reason, paused=paused, steps=self.step, seconds=round(self.elapsed, 1))
        self.log(f"done: {self.step} steps in {self.elapsed:.1f} s (stopped by {stop_reason})")
        if self.average is not None:
            self.use_average()  # after the state is saved: it keeps the last step's weights to resume from
            if self.val_batches:  # the same prompts measured just before on the last step's weights
                self._validate(weights=f"ema {self.s.ema}")
        return self.result()

    def use_average(self) -> None:
        """--ema: put the moving average into the head (once; the state file keeps the
        last step's weights and the average apart)."""
        if self.average is not None and not self.averaged:
            self.average.copy_to(self.params)
            self.averaged = True
            self.log(f"the head holds the moving average of its weights (--ema {self.s.ema}, {self.step} steps)")

    def _pause_deadline(self) -> tuple[Optional[float], Optional[str]]:
        """The earlier of --stop-after-seconds (from now: training seconds of this process)
        and --pause-at (a time of the wall clock), on the monotonic clock, with its option."""
        now = time.monotonic()
        pauses = []
        if self.s.stop_after_seconds:
            pauses.append((now + self.s.stop_after_seconds, "--stop-after-seconds"))
        if self.s.pause_at is not None:
            pauses.append((now + self.s.pause_at - time.time(), "--pause-at"))
        return min(pauses) if pauses else (None, None)

    def _log_window(self, window: list[dict], bar) -> None:
        keys = sorted({k for m in window for k in m})
        avg = {k: float(torch.stack([torch.as_tensor(m[k]).float().cpu() for m in window if k in m]).mean()) for k in keys}
        avg["tokens"] = sum(float(m["tokens"]) for m in window)
        record = {"step": self.step, "seconds": round(self.elapsed, 1), **{k: round(v, 5) for k, v in avg.items()}}
        self.history.append(record)
        accs = " ".join(f"{k} {avg[k]:.3f}" for k in keys if k.startswith("acc"))
        extra = f" v {avg['v_loss']:.4f} p {avg['p_loss']:.3f}" if "v_loss" in avg else ""
        line = (f"step {self.step}/{self.total} | loss {avg['loss']:.4f}{extra} | {accs} | lr {avg['lr']:.2e} "
                f"| {avg['tokens'] / max(1, len(window)):.0f} tok/step | {self.elapsed:.0f} s")
        (bar.write if bar is not None and not bar.disable else self.log)(line)

    def result(self) -> TrainResult:
        self.use_average()  # also when a failed run's head is saved as it is
        info = dict(self.info, method=self.s.method, target=_recorded_path(self.s.target), steps=self.step,
                    sequences=int(self.index.numel()), settings=_recorded_settings(self.s),
                    history=self.history[-20:])
        if self.val_history:
            info.update(held_out_sequences=int(self.val_index.numel()), held_out=self.val_history[-20:])
        return TrainResult(self.head, self.flat_config, self.target, self.step, self.history, info)

    # -- resumable state -------------------------------------------------------------------
    def _fingerprint(self) -> dict:
        s = self.s
        # depth and label temperature named only off their defaults: earlier states still match
        layers = self.flat_config["num_hidden_layers"]
        return {"method": s.method, "seed": s.seed, "token_budget": s.token_budget, "max_len": s.max_len,
                "sequences": int(self.index.numel()), "tokens": int(self.lengths.sum()),
                "draft_vocab_size": self.flat_config.get("draft_vocab_size"),
                **({"head_layers": layers} if layers != 1 else {}),
                **({"label_temperature": s.label_temperature} if s.label_temperature != 1.0 else {}),
                **({"ema": s.ema} if s.ema else {})}

    def save_state(self) -> None:
        if self.averaged:  # the head's weights are the average now: they must not be resumed from
            raise RuntimeError("save_state after use_average: the state would hold the average as the weights")
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "fingerprint": self._fingerprint(), "step": self.step, "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch, "elapsed": self.elapsed, "micro": self.micro,
            "head": {k: v.detach().cpu() for k, v in self.head.state_dict().items()
                     if k in self.params or k in ("d2t", "t2d")},
            "optimizer": self.optimizer.state_dict(), "noise_rng": self.noise_gen.get_state(),
            "history": json.dumps(self.history), "init_from": json.dumps(self.info.get("init_from")),
            "val_history": json.dumps(self.val_history),
            **({"ema": self.average.state_dict()} if self.average is not None else {}),
        }
        tmp = self.state_path.with_suffix(f".tmp-{os.getpid()}")
        torch.save(state, tmp)
        tmp.replace(self.state_path)

    def _load_state(self) -> None:
        if self.state_path is None or not self.state_path.is_file():
            self.log(f"--resume: no {STATE_FILE} in {self.s.state_dir}; starting from step 0")
            return
        state = torch.load(self.state_path, map_location="cpu", weights_only=True)
        if state["fingerprint"] != self._fingerprint():
            raise ValueError(f"{self.state_path} belongs to another run ({state['fingerprint']} vs "
                             f"{self._fingerprint()}): use another --state-dir or drop --resume")
        missing = [k for k in self.params if k not in state["head"]]
        if missing:
            raise ValueError(f"{self.state_path}: no saved values for {missing[:3]}; the file is incomplete")
        self.head.load_state_dict(state["head"], strict=False)
        if self.average is not None:  # the fingerprint names --ema, so the state has one
            self.average.load_state_dict(state.get("ema", {}), str(self.state_path))
        self.optimizer.load_state_dict(state["optimizer"])
        self.noise_gen.set_state(state["noise_rng"])
        self.step, self.epoch, self.batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        self.elapsed, self.micro = state["elapsed"], state["micro"]
        self.history = json.loads(state["history"])
        self.val_history = json.loads(state.get("val_history", "[]"))
        # The state wins over --init-from: the run it continues records its own start.
        self.info.pop("init_from", None)
        if json.loads(state.get("init_from", "null")):
            self.info["init_from"] = json.loads(state["init_from"])
        self.epoch_batches = plan_epoch(self.lengths, self.s.token_budget, self.s.seed, self.epoch)
        self.log(f"resumed from {self.state_path} at step {self.step}"
                 + (" (its weights, not --init-from's)" if self.s.init_from else ""))


def _init_eagle3_settings(s: TrainSettings, init, num_target_layers: int) -> list:
    """An EAGLE-3 warm start keeps the init head's draft vocabulary and aux layers:
    refuses --draft-vocab-size / --aux-layers that say otherwise. Returns the aux layers."""
    n = init.head.draft_vocab_size
    if s.draft_vocab_size and s.draft_vocab_size != n and not s.reselect_draft_vocab:
        raise ValueError(f"--draft-vocab-size {s.draft_vocab_size} conflicts with --init-from {s.init_from}, whose "
                         f"draft vocabulary has {n} tokens (a warm start keeps its d2t / t2d): drop "
                         f"--draft-vocab-size, pass {n}, or add --reselect-draft-vocab")
    ids = getattr(init.config, "eagle_aux_hidden_state_layer_ids", None)
    aux = list(ids) if ids else default_aux_layers(num_target_layers)  # absent: the engine's default
    if s.aux_layers and list(s.aux_layers) != aux:
        raise ValueError(f"--aux-layers {','.join(map(str, s.aux_layers))} conflicts with --init-from {s.init_from}, "
                         f"which reads target layers {','.join(map(str, aux))}: drop --aux-layers or pass "
                         f"{','.join(map(str, aux))}")
    return aux


def _recorded_path(path) -> Optional[str]:
    """A path as the head's training record keeps it: relative to the working directory when
    inside it (a head in a checkout records its place in the repository, not the machine's
    absolute path), as given otherwise (a hub id, a path elsewhere)."""
    if path is None:
        return None
    try:
        return str(Path(os.path.abspath(path)).relative_to(Path.cwd()))
    except (ValueError, OSError):
        return str(path)


PATH_SETTINGS = ("target", "init_from", "state_dir", "stop_file")


def _recorded_settings(s: TrainSettings) -> dict:
    """The settings as the training record keeps them, their paths as _recorded_path gives them."""
    settings = asdict(s)
    for key in PATH_SETTINGS:
        settings[key] = _recorded_path(settings[key])
    settings["data"] = [_recorded_path(d) for d in settings["data"]]
    return json.loads(json.dumps(settings, default=str))
