"""hvp.colour=static (paper section 6): one colour draw per image for all its candidates, the
selection scoring them uncoloured, the training step getting the chosen pair coloured."""

from __future__ import annotations

import pytest
import torch

from hvp_lightning.config import ConfigError, check_options
from hvp_lightning.data.augment import MultiViewTransform, normalize
from hvp_lightning.data.batched import finish_views
from hvp_lightning.data.datamodule import view_aug
from hvp_lightning.data.static_colour import COLOUR_KEYS, share_colour
from hvp_lightning.selection import pair_index

from ..conftest import build, typed


def _batch(cfg, b: int = 6, n: int = 4) -> dict:
    """A loader batch as the data module leaves it with defer_colour: uint8 crops + parameters."""
    aug = view_aug(typed(cfg).data)
    imgs = torch.randint(0, 256, (b, 3, 24, 24), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    items = [MultiViewTransform((aug,) * n, seed=1)(img, 0, i) for i, img in enumerate(imgs)]
    views = [torch.stack([it[0][v] for it in items]) for v in range(n)]
    params = {k: torch.stack([it[1][k] for it in items]) for k in items[0][1]}
    return {"views": views, "params": params, "label": torch.zeros(b, dtype=torch.long), "index": torch.arange(b)}


def test_share_colour_gives_every_candidate_view_0s_colour(cfg_factory):
    params = _batch(cfg_factory())["params"]
    shared = share_colour(params)
    for k, v in shared.items():
        if k in COLOUR_KEYS:
            assert torch.equal(v, params[k][:, :1].expand_as(v))
        else:
            assert torch.equal(v, params[k])  # crops and flips stay each view's own
    assert not torch.equal(params["brightness"][:, 0], params["brightness"][:, 1])  # they did differ


def test_selection_sees_uncoloured_candidates_and_the_step_the_coloured_pair(cfg_factory):
    torch.manual_seed(0)
    cfg = cfg_factory("+hvp=on", "hvp.colour=static", "data.crop_size=16")
    model = build(cfg).train()
    batch = _batch(cfg)
    crops, drawn, aug = list(batch["views"]), dict(batch["params"]), view_aug(typed(cfg).data)
    seen: dict = {}
    scores = model.candidate_scores

    def candidate_scores(b: dict) -> torch.Tensor:
        seen["selection"] = [v.clone() for v in b["views"]]
        return scores(b)

    def ssl_step(b: dict, batch_idx: int) -> torch.Tensor:
        seen["step"] = b
        return torch.zeros(())

    model.candidate_scores, model.ssl_step = candidate_scores, ssl_step  # type: ignore[method-assign]
    model.log = lambda *a, **k: None  # type: ignore[method-assign]
    model.training_step(batch, 0)
    for got, crop in zip(seen["selection"], crops):  # uncoloured: the crops normalised, nothing else
        assert torch.equal(got, normalize(crop, aug.mean, aug.std))
    step, choice = seen["step"], model.last_selection["choice"]
    pairs, rows = pair_index(4)[choice], torch.arange(len(choice))
    for k in COLOUR_KEYS:  # the two trained views share the image's one colour draw (view 0's)
        assert torch.equal(step["params"][k][:, 0], drawn[k][:, 0])
        assert torch.equal(step["params"][k][:, 1], drawn[k][:, 0])
    chosen = [torch.stack(crops)[pairs[:, j], rows] for j in (0, 1)]
    shared = {k: v[rows[:, None], pairs] for k, v in share_colour(drawn).items()}
    want = finish_views(chosen, shared, (aug,) * 2)
    assert all(torch.equal(g, w) for g, w in zip(step["views"], want))  # coloured, with the shared draw
    assert not torch.equal(want[0], normalize(chosen[0], aug.mean, aug.std))  # colour did change pixels


def test_static_colour_is_validated(cfg_factory):
    with pytest.raises(ConfigError, match=r"^hvp.colour='grey' is not allowed: one of per_view, static"):
        check_options(cfg_factory("+hvp=on", "hvp.colour=grey"))
    with pytest.raises(ConfigError, match=r"^hvp.colour='static' is not allowed: per_view for method dino"):
        check_options(cfg_factory("method=dino_cifar", "backbone=vit_tiny", "+hvp=on", "hvp.colour=static"))


@pytest.mark.slow  # a run
def test_tiny_train_run_with_static_colour(cfg_factory, tmp_path):
    from hvp_lightning.training.driver import run

    summary = run(cfg_factory("+hvp=on", "hvp.colour=static", "hvp.num_views=3"), tmp_path)
    assert summary["hvp"]["selected_samples"] > 0 and summary["train_loss"] is not None
