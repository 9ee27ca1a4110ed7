"""The LightningModule every method shares: its backbone, settings and optimiser, the features
a validation pass reads, and HVP's hooks that depend on the backbone or the data pipeline. A
method adds its heads, its loss and HVP's candidate scores.

A method is built from a backbone (any ``nn.Module`` giving ``[B, D]`` features, or a timm
model's name) and its typed settings, given as keyword arguments or as one settings object::

    SimCLR(timm.create_model("resnet50", num_classes=0), temperature=0.2, hvp=HVP(num_views=4))
    SimCLR(backbone, SimCLRSettings(temperature=0.2), hvp=HVP(num_views=4))

Its settings and HVP's are its hyperparameters (``save_hyperparameters``):
``SimCLR.load_from_checkpoint(path, backbone=...)`` rebuilds it around a backbone of the same
architecture (a backbone given by name is rebuilt from the checkpoint alone).

What a training batch holds: ``views``, a list of ``[B, 3, H, W]`` tensors, the views
:meth:`SSLMethod.views` asks for (2 per image without HVP, N candidates with it); with HVP's
``min_iou`` mode or static colour also ``params`` (the views' crop boxes and colour draws, as the
library's data pipeline makes them). Nothing else: no labels.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Mapping
from typing import Any, ClassVar

import lightning as L
import torch
from torch import nn

from ..nn.backbones import as_backbone
from ..nn.optim import make_optimizer, warmup_cosine
from ..nn.sync_free import device_number
from ..nn.teacher import MomentumTargetMixin
from ..settings import HVP, MethodSettings, SettingError, ViewSpec, hvp_settings
from ..settings.declare import shown

log = logging.getLogger(__name__)


class SSLMethod(L.LightningModule):
    """Everything a method needs that is not its loss. A method sets ``settings_type`` (its
    settings class) and implements ``ssl_step``; it may override ``param_groups`` (e.g. SimSiam's
    fixed-LR predictor) and :meth:`build` (its heads).

    Args:
        backbone: Any module mapping images to ``[B, D]`` features (a timm model built with
            ``num_classes=0``, a torchvision ResNet with ``fc = nn.Identity()``, a
            :class:`~hvp_lightning.nn.backbones.Backbone`), or a timm model's name.
        settings: The method's settings (its settings class, or a mapping of its keys); None: the
            defaults, the paper's recipe.
        hvp: HVP's settings (:class:`~hvp_lightning.settings.HVP`, or a mapping); None: HVP off,
            the method as published.
        feature_dim: D, where the backbone does not say it (no ``feature_dim``, ``num_features`` or
            ``embed_dim`` attribute).
        seed: Part of the seeds of HVP's private random draws (random mode, sampled combinations,
            iBOT's masks), which are functions of (seed, step, micro-batch, rank).
        **keys: Keys of the settings, on top of ``settings`` (``temperature=0.2``).
    """

    settings_type: ClassVar[type[MethodSettings]]
    #: What HVP's selection pass computes outside the networks, where it is not small: model FLOPs
    #: leave it out, so a run that counts them says so.
    uncounted_selection_work: ClassVar[str | None] = None
    #: hvp.colour=static: the data pipeline's colour step (``uncoloured(batch)``, ``coloured(batch)``),
    #: set by whoever makes the views (hvp-lightning's data module provides one).
    static_colour: Any = None

    def __init__(
        self,
        backbone: nn.Module | str,
        settings: MethodSettings | Mapping[str, Any] | None = None,
        *,
        hvp: HVP | Mapping[str, Any] | None = None,
        feature_dim: int | None = None,
        seed: int = 0,
        **keys: Any,
    ) -> None:
        super().__init__()
        base = self.settings_type.from_dict(settings)
        self.settings = self.settings_type.from_dict({**base.to_dict(), **keys}) if keys else base
        self.hvp = self.settings.resolve_hvp(hvp_settings(hvp))
        self.seed = int(seed)
        self.backbone = as_backbone(backbone, feature_dim)
        hparams: dict[str, Any] = {"settings": self.settings.to_dict(), "hvp": self.hvp.to_dict(), "seed": self.seed}
        if isinstance(backbone, str):  # rebuilt from the checkpoint alone
            hparams["backbone"] = backbone
        self.save_hyperparameters(hparams)
        self.compiled_modules: list[str] = []  # filled by configure_model (settings.compile)
        self.build()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A method's signature and docstring list its settings' keys (``help(SimCLR)``, tab
        completion), each with its doc and default, from the settings' declarations."""
        super().__init_subclass__(**kwargs)
        settings_type = cls.__dict__.get("settings_type")
        if settings_type is None:
            return
        params = list(inspect.signature(SSLMethod.__init__).parameters.values())[:-1]  # without **keys
        fields = {f.name: f for f in dataclasses.fields(settings_type)}
        extra = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=f.default) for k, f in fields.items()]
        cls.__signature__ = inspect.Signature([p for p in params if p.name != "self"] + extra)  # type: ignore[attr-defined]
        keys = "\n".join(
            f"        {k}: {f.metadata.get('doc', '')} (default: {shown(f.default)!r})" for k, f in fields.items()
        )
        cls.__doc__ = f"""{inspect.cleandoc(cls.__doc__ or "")}

Args:
    backbone: Any module giving ``[B, D]`` features (a timm model built with ``num_classes=0``, a
        torchvision ResNet whose ``fc`` is ``nn.Identity()``), or a timm model's name.
    settings: A :class:`~{settings_type.__module__}.{settings_type.__name__}` (or a mapping of its
        keys); None: its defaults, the paper's recipe.
    hvp: HVP's settings (:class:`~hvp_lightning.settings.HVP`); None: HVP off, the method as published.
    feature_dim: D, where the backbone does not say it.
    seed: Part of the seeds of HVP's private random draws.
    **keys: The settings' keys, on top of ``settings``:
{keys}
"""

    # --- hooks for methods ---------------------------------------------------------------
    def build(self) -> None:
        """Make the method's networks around ``self.backbone`` (called once ``settings``,
        ``hvp``, ``seed`` and ``backbone`` are set)."""

    def views(self) -> tuple[ViewSpec, ...]:
        """The views per image a training batch holds, in order (the loader reads this): 2
        without HVP, ``hvp.num_views`` candidates with it; DINO's multi-crop its own."""
        return self.settings.views(self.hvp)

    def ssl_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        return self.ssl_step(batch, batch_idx)

    def uncoloured_candidates(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``hvp.colour=static``, asked by :class:`~hvp_lightning.selection.HardViewMixin`: the
        candidates as the selection scores them (the data pipeline's crops without colour)."""
        return self._colour_step().uncoloured(batch)

    def colour_views(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``hvp.colour=static``: the chosen views coloured with their image's one colour draw."""
        return self._colour_step().coloured(batch)

    def _colour_step(self) -> Any:
        if self.static_colour is None:
            raise SettingError(
                "colour",
                "static",
                "per_view, or set the module's static_colour to the data pipeline's colour step (uncoloured(batch), "
                "coloured(batch); hvp-lightning's SSLDataModule.static_colour() is one)",
            ).at("hvp.")
        return self.static_colour

    def selection_size_rule(self) -> tuple[int, int]:
        """``hvp.selection_scale``: (multiple, minimum) of a view's side in the selection pass
        (:func:`~hvp_lightning.selection.scale.selection_side`): a ViT's patch (a whole token
        grid), else the smallest side the backbone takes (a ResNet: 8 px with the CIFAR stem,
        else 32 px)."""
        patch = self.backbone.patch_size
        if patch:
            return int(patch), int(patch)
        return 1, int(self.backbone.min_side)

    def param_groups(self) -> list[dict[str, Any]]:
        """Optimiser parameter groups; a group may carry ``fixed_lr`` (no schedule) or ``lr_scale``
        (its peak lr relative to the scaled ``base_lr``)."""
        return [{"params": [p for p in self.parameters() if p.requires_grad]}]

    def configure_model(self) -> None:
        """``settings.compile``: ``torch.compile`` every backbone (student, and teacher where
        there is one) in place, so state-dict keys and checkpoints stay as without it. Done
        here, once the model is complete, not in ``__init__``: DINO/iBOT deep-copy the student
        into the teacher there, and a copied compiled module would call the original."""
        if not self.settings.compile or self.compiled_modules:
            return
        for name, module in self.named_modules():
            if name.split(".")[-1] == "backbone":
                module.compile()
                self.compiled_modules.append(name)

    @torch.no_grad()
    def start_backbone_from(self, state: dict[str, torch.Tensor]) -> None:
        """Released weights into the backbone's trunk (strict), before training. A momentum
        target (DINO/iBOT's teacher, BYOL/MoCo v3's target) was copied from the backbone at
        construction: it gets the same weights, so it starts equal to the student."""
        self.backbone.trunk.load_state_dict(state, strict=True)
        if isinstance(self, MomentumTargetMixin):
            for target, online in self.momentum_pairs():
                if online is self.backbone:
                    target.load_state_dict(online.state_dict(), strict=True)

    @property
    def eval_backbone(self) -> nn.Module:
        """Backbone whose features are evaluated (the teacher's for DINO/iBOT)."""
        return self.backbone

    # --- the features a validation pass reads ------------------------------------------------------
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        """The evaluated backbone's features ``[B, D]`` (fp32) of a validation batch's images (a
        dict's ``image``, a tuple's first item, or a tensor): what online monitors read, as
        ``outputs`` of ``on_validation_batch_end`` (hvp-lightning's k-NN and RankMe callback)."""
        images = batch["image"] if isinstance(batch, Mapping) else batch
        images = images[0] if isinstance(images, (list, tuple)) else images
        return self.eval_backbone(images).float()

    # --- optimisation --------------------------------------------------------------------
    @property
    def global_batch_size(self) -> int:
        """Images per optimiser step over all processes (devices x nodes) and accumulated
        micro-batches: the batch the papers' learning-rate rules refer to."""
        t = self.trainer
        return self.device_batch_size() * t.world_size * t.accumulate_grad_batches

    def device_batch_size(self) -> int:
        """``settings.batch_size``, else the batch size of the trainer's training loader (loaded by
        ``estimated_stepping_batches`` when the trainer trains for ``max_epochs``)."""
        if self.settings.batch_size is not None:
            return self.settings.batch_size
        loader = self.trainer.train_dataloader
        sampler = getattr(loader, "batch_sampler", None)
        size = getattr(loader, "batch_size", None) or getattr(sampler, "batch_size", None)
        if not isinstance(size, int):
            raise SettingError("batch_size", None, "an integer >= 2, the images per device per step, which the "
                               "learning rate scales with (the trainer has no training loader that says it: it loads "
                               "one for trainer.max_epochs, not for max_steps alone)")  # fmt: skip
        return size

    def configure_optimizers(self) -> dict[str, Any]:
        opt = self.settings.optimizer
        total = max(1, int(self.trainer.estimated_stepping_batches))  # loads the training loader
        lr = opt.base_lr * self.global_batch_size / 256  # linear scaling rule (all four papers)
        # DINO/iBOT end the cosine at an absolute min_lr (1e-6) whatever the batch; the others at a ratio (0).
        final_ratio = opt.min_lr / lr if opt.min_lr is not None else float(opt.final_lr_ratio)
        groups = self.param_groups()
        for g in groups:  # a group's own lr relative to the others' (Barlow Twins' biases)
            if "lr_scale" in g:
                g["lr"] = lr * g.pop("lr_scale")
        optimizer = make_optimizer(opt.name, groups, lr, opt.weight_decay, opt.momentum, opt.eta)
        steps_per_epoch = max(1, total // max(1, self.trainer.max_epochs or 1))
        warmup = int(opt.warmup_epochs * steps_per_epoch)

        def schedule(step: int) -> float:
            return warmup_cosine(step, total, warmup, final_ratio)

        lambdas = [(lambda _: 1.0) if g.get("fixed_lr") else schedule for g in groups]
        sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambdas)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_train_batch_end(self, outputs: Any, batch: dict[str, Any], batch_idx: int) -> None:
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False, batch_size=1)  # type: ignore[union-attr]

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        """Lightning's ``log``, a Python number made on the module's device first
        (:func:`~hvp_lightning.nn.sync_free.device_number`, the value Lightning would make):
        Lightning copies it from the host, which waits for the GPU's queue on every logged
        number of a step. A trainer callback with a ``take_log(module, name, value, kwargs)``
        method may take the value instead (True: it logged it), e.g. to keep a training value's
        epoch aggregate across a mid-epoch resume (hvp-lightning's ``EpochAggregates``)."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = device_number(value, self.device)
        if args or not self._taken(name, value, kwargs):
            super().log(name, value, *args, **kwargs)

    def _taken(self, name: str, value: Any, kwargs: dict[str, Any]) -> bool:
        try:
            callbacks = self.trainer.callbacks
        except RuntimeError:  # not attached to a Trainer
            return False
        for callback in callbacks:
            take = getattr(callback, "take_log", None)
            if take is not None and take(self, name, value, kwargs):
                return True
        return False
