"""The linear head on features: linear probe (frozen or cached features) and fine-tuning."""

from __future__ import annotations

import logging
import math
import time
import warnings
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from ..nn.optim import make_optimizer, warmup_cosine
from ..schema import EvalConfig
from .features import FeatureNet, eval_trainer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeadRecipe:
    """How the head (and, fine-tuning, the backbone) trains: the protocol's resolved recipe
    (:func:`~hvp_lightning.evaluation.protocols.protocol_settings`, its ``lr`` scaled to the batch)."""

    optimizer: str
    lr: float
    weight_decay: float
    momentum: float
    warmup_epochs: float
    epochs: int

    @classmethod
    def of(cls, s: dict[str, Any]) -> HeadRecipe:
        return cls(s["optimizer"], s["lr"], s["weight_decay"], s["momentum"], s["warmup_epochs"], s["epochs"])


class Classifier(L.LightningModule):
    """A linear head on features: frozen (linear probe, backbone in eval mode, no gradients),
    trained (fine-tuning) or precomputed (``features=None``: batches are feature tensors)."""

    def __init__(
        self,
        features: FeatureNet | None,
        feature_dim: int,
        num_classes: int,
        recipe: HeadRecipe,
        finetune: bool = False,
    ) -> None:
        super().__init__()
        self.features, self.recipe, self.finetune, self.num_classes = features, recipe, finetune, num_classes
        self.head = nn.Linear(feature_dim, num_classes)
        nn.init.normal_(self.head.weight, std=0.01)  # as the SimSiam / DINO linear classifiers
        nn.init.zeros_(self.head.bias)
        if features is not None:
            features.requires_grad_(finetune)  # the teacher copy comes frozen
        # top-1 hits, top-5 hits, samples: a buffer, so it sits on the device of the batches it counts
        self.register_buffer("test_counts", torch.zeros(3, dtype=torch.long), persistent=False)
        self.top1_per_epoch: list[float] = []  # the test top-1 after each training epoch

    def train(self, mode: bool = True):
        super().train(mode)
        if self.features is not None and not self.finetune:
            self.features.eval()  # frozen: BatchNorm statistics stay the pretrained ones
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.features is not None:
            if self.finetune:
                x = self.features(x)
            else:
                with torch.no_grad():
                    x = self.features(x)
        return self.head(x.float() if self.features is None else x)

    @staticmethod
    def _xy(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return (batch["image"], batch["label"]) if isinstance(batch, dict) else (batch[0], batch[1])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = self._xy(batch)
        logits = self(x)
        loss = F.cross_entropy(logits.float(), y)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=y.shape[0])
        self.log(
            "train/acc", (logits.argmax(1) == y).float().mean(), on_step=False, on_epoch=True, batch_size=y.shape[0]
        )
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False, batch_size=1)  # type: ignore[union-attr]
        return loss

    def on_validation_epoch_start(self) -> None:
        self.test_counts.zero_()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = self._xy(batch)
        top = self(x).topk(min(5, self.num_classes), dim=1).indices
        hit = top == y[:, None]
        self.test_counts += torch.stack(
            [hit[:, 0].sum(), hit.any(1).sum(), torch.full_like(hit[:, 0].sum(), y.shape[0])]
        )

    def on_validation_epoch_end(self) -> None:
        n = max(1, int(self.test_counts[2]))
        self.log("eval/top1", self.test_counts[0].item() / n, prog_bar=True)
        self.log("eval/top5", self.test_counts[1].item() / n)
        self.top1_per_epoch.append(self.test_counts[0].item() / n)

    @property
    def test_metrics(self) -> dict[str, Any]:
        """The last epoch's top-1 / top-5, and the best top-1 over epochs: what the official
        eval_linear.py reports (dino:eval_linear.py line 192 ``best_acc = max(...)``, written to
        results.txt at line 217; main:eval_linear.py line 188), hence the paper's tables."""
        n = max(1, int(self.test_counts[2]))
        history = self.top1_per_epoch
        best = max(range(len(history)), key=history.__getitem__) if history else None
        return {
            "top1": self.test_counts[0].item() / n,
            "top5": self.test_counts[1].item() / n,
            "best_top1": history[best] if best is not None else None,
            "best_epoch": best + 1 if best is not None else None,
            "top1_per_epoch": list(history),
        }

    def optimizer(self) -> torch.optim.Optimizer:
        """Weight decay on every trained parameter, biases and norms included: one parameter group,
        as the official optimisers (dino:eval_linear.py lines 129-139, main:eval_linear.py lines 128-138)."""
        r = self.recipe
        params = [p for p in self.parameters() if p.requires_grad]
        return make_optimizer(r.optimizer, [{"params": params}], r.lr, r.weight_decay, r.momentum)

    def configure_optimizers(self):
        r = self.recipe
        opt = self.optimizer()
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = int(r.warmup_epochs * total / max(1, r.epochs))

        def schedule(step: int) -> float:  # linear warm-up, then cosine to 0 (per step)
            return warmup_cosine(step, total, warmup)

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class FirstEpochETA(L.Callback):
    """Logs, after the first epoch, how long the remaining epochs will take at that pace."""

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == 0:
            self.start = time.perf_counter()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == 0 and trainer.max_epochs:
            took = time.perf_counter() - self.start
            log.info(
                "epoch 1 of %d took %.1f s: about %.0f s to go",
                trainer.max_epochs,
                took,
                took * (trainer.max_epochs - 1),
            )


def lars_growth_bound(lr: float, total_steps: int, warmup_steps: int, momentum: float, eta: float = 1e-3) -> float:
    """The most LARS can grow a weight matrix's norm over a run, as a factor (>= 1).

    Why: LARS moves a matrix by at most ``lr_t * eta * ||w||`` per step (its trust ratio), and
    momentum adds that up to ``1 / (1 - momentum)`` times, so ``||w||`` grows at most
    ``exp(eta / (1 - momentum) * sum_t lr_t)``-fold, and moves at most (that - 1) times its
    initial norm. The SimSiam recipe at its own scale (lr 1.6 at batch 4,096, 90 ImageNet
    epochs: 28k steps) allows about e^225; its linear scaling down to a small dataset's batch
    and step count can allow under 2x, and the head then stays near its init (std 0.01).
    ``total_steps`` / ``warmup_steps``: the probe's schedule (linear warm-up, cosine to 0)."""
    total_lr = lr * sum(warmup_cosine(t, total_steps, warmup_steps) for t in range(total_steps))
    return math.exp(min(700.0, eta * total_lr / (1.0 - momentum)))


def warn_if_lars_cannot_fit(r: HeadRecipe, batch_size: int, steps_per_epoch: int) -> None:
    """A warning when the LARS recipe, at this batch and step count, cannot even double the
    head's weight norm: the probe would report an untrained classifier, not the features."""
    if r.optimizer != "lars":
        return
    total = r.epochs * steps_per_epoch
    growth = lars_growth_bound(r.lr, total, int(r.warmup_epochs * steps_per_epoch), r.momentum)
    if growth < 2.0:
        log.warning(
            "protocol.optimizer=lars at batch %d (lr %.3g) for %d steps can grow the linear head's weights "
            "at most %.2fx from their init (std 0.01): too little to fit it; its accuracy would measure the "
            "optimiser, not the features. The recipe's own scale (batch 4,096, 90 ImageNet epochs) allows "
            "e^225. Use protocol.optimizer=sgd here, or raise protocol.base_lr / protocol.epochs.",
            batch_size,
            r.lr,
            total,
            growth,
        )


def fit_classifier(
    cfg: EvalConfig, model: Classifier, train_loader: DataLoader, test_loader: DataLoader, epochs: int, logger=False
) -> dict[str, Any]:
    """Train ``model`` for ``epochs``, scoring ``test_loader`` after each as the official code
    does (val_freq 1); its :attr:`Classifier.test_metrics` and the last epoch's training loss."""
    trainer = eval_trainer(cfg, logger=logger, max_epochs=epochs, validate=True)
    trainer.callbacks.append(FirstEpochETA())
    model.train()  # Lightning keeps the modes it is given; a probe's frozen features stay in eval mode
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*module\\(s\\) in eval mode.*")  # the probe's frozen features
        trainer.fit(model, train_dataloaders=train_loader, val_dataloaders=test_loader)
    train_loss = trainer.callback_metrics.get("train/loss_epoch")
    return {**model.test_metrics, "train_loss": float(train_loss) if train_loss is not None else None}
