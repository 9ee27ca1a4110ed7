"""What HardViewMixin needs of its host and of a batch: the hooks of docs/methods.md, nothing else
(no labels; static colour only through the host's hooks)."""

from __future__ import annotations

from unittest.mock import PropertyMock, patch

import lightning as L
import pytest
import torch

from hvp_lightning.methods.simsiam import SimSiam
from hvp_lightning.selection import HardViewMixin, HVPConfig, pair_index

from ..conftest import build


@pytest.mark.parametrize("step", [0, 1])  # every_n_steps=2: a selection step, then an off-step
def test_a_batch_without_labels_trains(cfg_factory, step):
    torch.manual_seed(0)
    model = build(cfg_factory("+hvp=on", "hvp.num_views=3", "hvp.every_n_steps=2")).train()
    model.log = lambda *a, **k: None  # type: ignore[method-assign]
    batch = {"views": [torch.randn(4, 3, 16, 16) for _ in range(3)]}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with patch.object(SimSiam, "global_step", new_callable=PropertyMock, return_value=step):
        loss = model.training_step(batch, 0)
    model.load_state_dict(state)
    choice = model.last_selection["choice"] if step == 0 else torch.zeros(4, dtype=torch.long)
    pairs, rows = pair_index(3)[choice], torch.arange(4)
    views = torch.stack(batch["views"])
    chosen = {"views": [views[pairs[:, 0], rows], views[pairs[:, 1], rows]]}
    torch.testing.assert_close(loss, model.ssl_step(chosen, 0))  # the chosen (off-step: first) pair's step


class Bare(HardViewMixin, L.LightningModule):
    """A host with the two hooks a pair method needs, and none for static colour."""

    def __init__(self, hvp: HVPConfig) -> None:
        super().__init__()
        self.hvp = hvp

    def candidate_scores(self, batch: dict) -> torch.Tensor:
        return torch.zeros(batch["views"][0].shape[0], 3)

    def ssl_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return torch.zeros(())


def test_static_colour_asks_the_host_for_its_colour_hooks():
    host = Bare(HVPConfig(enabled=True, num_views=3, colour="static"))
    with pytest.raises(
        NotImplementedError, match="hvp.colour=static: Bare must provide uncoloured_candidates, colour_views"
    ):
        host.training_step({"views": [torch.zeros(2, 3, 4, 4, dtype=torch.uint8)] * 3}, 0)
