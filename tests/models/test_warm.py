"""Warm starts: rows follow their raw ids into a new id map; new ids keep their initialisation."""

from __future__ import annotations

import torch

from models.bert4rec import BERT4Rec, BERT4RecConfig
from models.ids import N_SPECIAL, IdMap
from models.sasrec import SASRec, SASRecConfig
from models.warm import FIRST_SEEN_LIVE, added_live, carry_over, first_seen_live, row_sources


def _sasrec(vocab: int, seed: int) -> SASRec:
    torch.manual_seed(seed)
    return SASRec(SASRecConfig(vocab_size=vocab, max_len=8, d_model=8, n_heads=2, n_layers=1, d_ff=16))


def test_row_sources_follow_raw_ids() -> None:
    old, new = IdMap(["a", "b", "c"]), IdMap(["c", "x", "a"])
    assert row_sources(old, new).tolist() == [0, 1, old.index("c"), -1, old.index("a")]


def test_sasrec_rows_follow_their_items_and_new_items_stay_fresh() -> None:
    old_ids, new_ids = IdMap(["a", "b", "c"]), IdMap(["c", "new", "a", "b"])
    old, new = _sasrec(len(old_ids), 0), _sasrec(len(new_ids), 1)
    fresh_row = new.encoder.token_emb.weight[new_ids.index("new")].clone()
    got = carry_over(new, old.state_dict(), old_ids, new_ids)
    emb_old, emb_new = old.encoder.token_emb.weight, new.encoder.token_emb.weight
    for raw in ("a", "b", "c"):
        assert torch.equal(emb_new[new_ids.index(raw)], emb_old[old_ids.index(raw)])
    assert torch.equal(emb_new[new_ids.index("new")], fresh_row)
    assert torch.equal(emb_new[:N_SPECIAL], emb_old[:N_SPECIAL])
    old_rest = {k: v for k, v in old.state_dict().items() if "token_emb" not in k and v.is_floating_point()}
    for k, v in old_rest.items():  # everything not indexed by items: copied whole
        if v.shape == new.state_dict()[k].shape and v.shape[0] != len(old_ids):
            assert torch.equal(new.state_dict()[k], v), k
    assert (got.ids_kept, got.ids_new) == (3, 1)


def test_bert4rec_mask_row_moves_past_the_new_items() -> None:
    old_ids, new_ids = IdMap(["a", "b"]), IdMap(["a", "b", "n1", "n2"])
    cfg = {"max_len": 8, "d_model": 8, "n_heads": 2, "n_layers": 1, "d_ff": 16}
    torch.manual_seed(0)
    old = BERT4Rec(BERT4RecConfig(vocab_size=len(old_ids), **cfg))
    new = BERT4Rec(BERT4RecConfig(vocab_size=len(new_ids), **cfg))
    carry_over(new, old.state_dict(), old_ids, new_ids)
    assert torch.equal(new.encoder.token_emb.weight[len(new_ids)], old.encoder.token_emb.weight[len(old_ids)])
    assert torch.equal(new.out_bias[new_ids.index("b")], old.out_bias[old_ids.index("b")])


def test_live_steps_the_table_holds_are_not_read_twice(tiny_artifacts: object) -> None:
    """A candidate trained on live events still sees them in the store (it does not drop them): the steps no
    newer than the user's newest stored step are skipped, and a step without a time is kept."""
    import math
    from pathlib import Path

    from models.artifact import latest_versions
    from models.engine import EngineOptions
    from models.tasks import TASKS
    from models.tasks.recommend import RecQuery

    assert isinstance(tiny_artifacts, Path)
    engine = TASKS["recommend"].open(latest_versions(tiny_artifacts)["sasrec-tiny"], EngineOptions(trace=False))
    stored = engine.stored_timeline("u1")
    newest = max(t for _, t, _ in stored)
    held = [s[0] for s in stored if s[1] == newest]
    other = next(i for i in map(str, range(10, 30)) if i not in held)  # at the same second, not held
    live = [
        (stored[0][0], stored[0][1], None),  # older than the newest stored step: held
        (held[0], newest, None),  # the newest stored step itself: held
        (other, newest, None),
        ("11", newest + 60, None),
        ("12", math.nan, None),
    ]
    (prepared,) = engine.prepare([RecQuery(user_id="u1")], {"u1": live})
    (alone,) = engine.prepare([RecQuery(user_id="u1")], {})
    assert prepared.history == alone.history + engine.art.items.indices([other, "11", "12"])


def test_a_warm_retrain_records_the_items_first_seen_live_its_parents_included() -> None:
    cold = IdMap(["a", "b"])
    first = IdMap(["a", "b", "c", "d"])  # c and d first seen live
    config = {"warm_start": {FIRST_SEEN_LIVE: added_live({}, cold, first)}}
    assert first_seen_live(config) == ["c", "d"]
    second = IdMap(["a", "c", "e"])  # b and d gone from the data, e new
    assert added_live(config, first, second) == ["c", "e"]
    assert first_seen_live({}) == [] and first_seen_live({"warm_start": {"from": "x"}}) == []


def test_a_social_model_carries_users_and_actions_through_their_own_maps() -> None:
    from models.social import SocialConfig, SocialModel
    from models.warm import Remap

    def social(users: IdMap, actions: IdMap, seed: int) -> SocialModel:
        torch.manual_seed(seed)
        cfg = SocialConfig(n_users=len(users), n_actions=len(actions), emb_dim=4, n_heads=2, d_ff=8, n_own_actions=2)
        return SocialModel(cfg)

    old_users, new_users = IdMap(["u1", "u2", "u3"]), IdMap(["u3", "u9", "u1", "u2"])
    old_actions, new_actions = IdMap(["a2q", "c2a"]), IdMap(["c2a", "a2q"])
    old, new = social(old_users, old_actions, 0), social(new_users, new_actions, 1)
    fresh_user = new.user_emb.weight[new_users.index("u9")].clone()
    got = carry_over(new, old.state_dict(), old_users, new_users, Remap(old_actions, new_actions))
    for raw in ("u1", "u2", "u3"):
        assert torch.equal(new.user_emb.weight[new_users.index(raw)], old.user_emb.weight[old_users.index(raw)])
        assert torch.equal(new.user_bias[new_users.index(raw)], old.user_bias[old_users.index(raw)])
    assert torch.equal(new.user_emb.weight[new_users.index("u9")], fresh_user)
    for raw in ("a2q", "c2a"):  # the actions' rows follow their ids, not their places
        assert torch.equal(new.action_emb.weight[new_actions.index(raw)], old.action_emb.weight[old_actions.index(raw)])
    assert (got.ids_kept, got.ids_new) == (3, 1) and got.fresh == []


def test_a_tensor_two_maps_would_fit_stays_fresh() -> None:
    """Users and actions of the same sizes: which map a table runs over cannot be told, so no row is guessed."""
    from models.social import SocialConfig, SocialModel
    from models.warm import Remap

    old_ids, new_ids = IdMap(["x", "y"]), IdMap(["y", "x"])
    cfg = SocialConfig(n_users=len(new_ids), n_actions=len(new_ids), emb_dim=4, n_heads=2, d_ff=8)
    torch.manual_seed(0)
    old = SocialModel(cfg)
    new = SocialModel(cfg)
    before = new.user_emb.weight.clone()
    got = carry_over(new, old.state_dict(), old_ids, new_ids, Remap(old_ids, new_ids))
    assert {"user_emb.weight", "action_emb.weight", "user_bias"} <= set(got.fresh)
    assert torch.equal(new.user_emb.weight, before)
