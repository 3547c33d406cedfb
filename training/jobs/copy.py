"""The seq2seq copy task: an encoder-decoder learns to copy random token sequences. The fastest way
to know that attention, masks, positions and decoding are right before trusting them on real data.

    python -m training copy-task [--config training/configs/copy_task.toml] [--set section.key=value]

Writes to runs/copy-task/<version>/: model.pt (the best epoch by validation loss), metrics.json (per
epoch: train and validation loss, token accuracy over non-padding tokens, whole-sequence accuracy of
greedy decoding; and the longer-sequence test), run_config.json (with the best checkpoint's epoch,
path and loss), predictions.json (fixed validation samples) and curves.png.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from models import artifact
from models.ids import PAD
from models.kinds import build
from models.seq2seq import BOS, EOS, FIRST_TOKEN, Seq2Seq, Seq2SeqBatch
from training.config import LoopConfig
from training.job import Export, Job
from training.jobs import TaskJob, register_job
from training.loop import length_buckets
from training.preflight import preflight_seq2seq

PREDICTIONS = "predictions.json"


@dataclass
class CopyData:
    vocab_size: int = 32  # PAD 0, BOS 1, EOS 2, symbols 3..vocab_size - 1
    min_len: int = 5
    max_len: int = 20
    num_samples: int = 20_000  # training sequences
    val_samples: int = 1_000
    seed: int = 0  # the data's own seed (train.seed seeds the model)
    # Length generalisation: sequences longer than any seen in training (0 = not measured).
    test_min_len: int = 21
    test_max_len: int = 30
    test_samples: int = 1_000

    def __post_init__(self) -> None:
        if not 1 <= self.min_len <= self.max_len:
            raise ValueError("data.min_len must be in [1, data.max_len]")
        if self.vocab_size <= FIRST_TOKEN:
            raise ValueError("data.vocab_size must leave room for at least one symbol")


@dataclass
class CopyEval:
    batch_size: int = 500
    predictions: int = 20  # fixed validation samples written to predictions.json


def random_sequences(n: int, *, min_len: int, max_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(FIRST_TOKEN, vocab_size) for _ in range(rng.randint(min_len, max_len))] for _ in range(n)]


def collate(seqs: Sequence[list[int]]) -> Seq2SeqBatch:
    """src = tokens + EOS, tgt_in = BOS + tokens, tgt_out = tokens + EOS; right-padded to the longest."""
    width = max(len(s) for s in seqs) + 1
    src = torch.full((len(seqs), width), PAD, dtype=torch.long)
    tgt_in, tgt_out = src.clone(), src.clone()
    for i, s in enumerate(seqs):
        t = torch.tensor(s, dtype=torch.long)
        n = len(s)
        src[i, :n], src[i, n] = t, EOS
        tgt_in[i, 0], tgt_in[i, 1 : n + 1] = BOS, t
        tgt_out[i, :n], tgt_out[i, n] = t, EOS
    return Seq2SeqBatch(src, tgt_in, tgt_out)


def strip(tokens: list[int]) -> list[int]:
    """A decoded row up to (not including) its EOS."""
    return tokens[: tokens.index(EOS)] if EOS in tokens else [t for t in tokens if t != PAD]


class CopyJob(Job[CopyData, LoopConfig, CopyEval]):
    task = "copy"
    data_config = CopyData
    eval_config = CopyEval
    key_metric = "-loss"  # the best checkpoint by validation loss
    curve_keys = ("token_acc", "seq_acc")
    default_out = Path("runs")

    def prepare_data(self) -> None:
        d = self.cfg.data
        common = {"vocab_size": d.vocab_size}
        self.train_seqs = random_sequences(d.num_samples, min_len=d.min_len, max_len=d.max_len, seed=d.seed, **common)
        self.val_seqs = random_sequences(d.val_samples, min_len=d.min_len, max_len=d.max_len, seed=d.seed + 1, **common)
        self.test_seqs = (
            random_sequences(d.test_samples, min_len=d.test_min_len, max_len=d.test_max_len, seed=d.seed + 2, **common)
            if d.test_max_len
            else []
        )

    def build_model(self) -> Seq2Seq:
        d = self.cfg.data
        longest = max(d.max_len, d.test_max_len) + 1  # tokens + EOS
        config = {"vocab_size": d.vocab_size, "max_len": max(64, longest), **self.cfg.model}
        model = build(self.cfg.kind, config)
        assert isinstance(model, Seq2Seq)
        return model

    def train_batches(self, model: nn.Module) -> Callable[[torch.Generator], Sequence[Seq2SeqBatch]]:
        lengths = torch.tensor([len(s) for s in self.train_seqs])
        bs = self.cfg.train.batch_size

        def make(gen: torch.Generator) -> list[Seq2SeqBatch]:
            return [collate([self.train_seqs[i] for i in idx.tolist()]) for idx in length_buckets(lengths, bs, gen)]

        return make

    def preflight(self, model: nn.Module) -> None:
        assert isinstance(model, Seq2Seq)
        preflight_seq2seq(model, collate(self.train_seqs[: self.cfg.train.batch_size]).to(self.device))

    def _measure(self, model: Seq2Seq, seqs: list[list[int]]) -> dict[str, float]:
        """Teacher-forced loss and token accuracy over non-padding tokens; greedy whole-sequence accuracy."""
        bs = self.cfg.eval.batch_size
        loss_sum, tokens, right, exact = 0.0, 0, 0, 0
        with torch.inference_mode():
            for lo in range(0, len(seqs), bs):
                part = seqs[lo : lo + bs]
                b = collate(part).to(self.device)
                logits = model(b.src, b.tgt_in)
                real = b.tgt_out != PAD
                loss_sum += float(nn.functional.cross_entropy(logits[real], b.tgt_out[real], reduction="sum"))
                right += int((logits.argmax(-1)[real] == b.tgt_out[real]).sum())
                tokens += int(real.sum())
                out = model.greedy(b.src, max_len=b.tgt_out.size(1) + 1).cpu().tolist()
                exact += sum(strip(o) == s for o, s in zip(out, part, strict=True))
        return {"loss": loss_sum / tokens, "token_acc": right / tokens, "seq_acc": exact / len(seqs)}

    def validate(self, model: nn.Module) -> dict[str, float]:
        assert isinstance(model, Seq2Seq)
        return self._measure(model, self.val_seqs)

    def evaluate(self, model: nn.Module) -> dict[str, Any]:
        assert isinstance(model, Seq2Seq)
        h = self.history
        best = h.val[h.best_epoch - 1] if h.best_epoch else {}
        d = self.cfg.data
        out: dict[str, Any] = {
            "epochs": [
                {
                    "epoch": e,
                    "train_loss": tl,
                    "val_loss": v.get("loss"),
                    "val_token_acc": v.get("token_acc"),
                    "val_seq_acc": v.get("seq_acc"),
                    "seconds": s,
                }
                for e, tl, v, s in zip(h.epoch, h.loss, h.val, h.seconds, strict=True)
            ],
            "valid": best,
            "positions": model.config.positions,
        }
        if self.test_seqs:
            out["longer"] = {"lengths": [d.test_min_len, d.test_max_len], **self._measure(model, self.test_seqs)}
        return out

    def export(self, model: nn.Module) -> Export:
        assert isinstance(model, Seq2Seq)
        shown = self.val_seqs[: self.cfg.eval.predictions]
        with torch.inference_mode():
            b = collate(shown).to(self.device)
            decoded = model.greedy(b.src, max_len=b.tgt_out.size(1) + 1).cpu().tolist()
        predictions = [
            {
                "source": [*s, EOS],
                "target": [*s, EOS],
                "output": [*strip(o), EOS] if EOS in o else strip(o),
                "match": strip(o) == s,
            }
            for s, o in zip(shown, decoded, strict=True)
        ]
        h = self.history
        best = {
            "epoch": h.best_epoch,
            "path": artifact.WEIGHTS,
            "val_loss": h.val[h.best_epoch - 1].get("loss") if h.best_epoch else None,
        }
        d = self.cfg.data
        info = {
            "source": "generated",
            "sha256": "",
            "seed": d.seed,
            "train": len(self.train_seqs),
            "valid": len(self.val_seqs),
            "longer": len(self.test_seqs),
        }
        return Export(files={PREDICTIONS: predictions}, data=info, namespace="", run_config={"best_checkpoint": best})


# Proves the attention blocks; trained, not served.
register_job(TaskJob(CopyJob, command="copy-task", config="training/configs/copy_task.toml"))
