"""The one registry from model kind to (config dataclass, module class)."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from models.base import SequentialRecommender
from models.bert4rec import BERT4Rec, BERT4RecConfig
from models.mhsa import MHSA, MHSAConfig
from models.sasrec import SASRec, SASRecConfig
from models.seq2seq import Seq2Seq, Seq2SeqConfig
from models.social import SocialConfig, SocialModel

REGISTRY: dict[str, tuple[type[Any], type[nn.Module]]] = {
    "sasrec": (SASRecConfig, SASRec),
    "bert4rec": (BERT4RecConfig, BERT4Rec),
    "mhsa": (MHSAConfig, MHSA),
    "seq2seq": (Seq2SeqConfig, Seq2Seq),
    "social": (SocialConfig, SocialModel),
}


def build(kind: str, config: dict[str, Any]) -> nn.Module:
    """Construct a model from its kind and config mapping alone."""
    if kind not in REGISTRY:
        raise KeyError(f"unknown model kind {kind!r}; known: {sorted(REGISTRY)}")
    config_cls, model_cls = REGISTRY[kind]
    known = {f.name for f in dataclasses.fields(config_cls)}
    unknown = set(config) - known
    if unknown:
        raise ValueError(f"unknown {kind} config key(s) {sorted(unknown)}; known: {sorted(known)}")
    return model_cls(config_cls(**config))


def build_recommender(kind: str, config: dict[str, Any]) -> SequentialRecommender:
    model = build(kind, config)
    if not isinstance(model, SequentialRecommender):
        raise TypeError(f"model kind {kind!r} is not a sequential recommender")
    return model
