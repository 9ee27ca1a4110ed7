"""Pretrain DINO with hard views around a timm ViT, on images and a loader of your own, with a
plain ``lightning.Trainer``: the library without the application (no Hydra, no configs).

The method says which views it needs per image (``model.views()``: with HVP, 4 global candidates
alternating DINO's two pipelines and the local candidates); your loader makes them, here with
torchvision's transforms. Each training step then scores every (global pair, locals) combination
with DINO's own loss, without gradients, and trains on the hardest per image.

    python examples/dino_timm.py             # a few steps on generated images, CPU or GPU
"""

from __future__ import annotations

import lightning as L
import timm
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from hvp_lightning import DINO, HVP, ViewSpec

CROP = 32  # the global crops' side; a view that names no size of its own takes it


def view_transform(view: ViewSpec) -> v2.Compose:
    """Your augmentation for one view the method asks for: its crop size and scale, blur,
    solarize and jitter where it sets them (DINO's pipelines differ in blur and solarize)."""
    size = view.size or CROP
    return v2.Compose(
        [
            v2.RandomResizedCrop(size, scale=view.scale or (0.25, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
            v2.RandomApply([v2.ColorJitter(0.4, 0.4, view.saturation or 0.2, 0.1)], p=0.8),
            v2.RandomGrayscale(p=0.2),
            v2.RandomApply([v2.GaussianBlur(3, sigma=(0.1, 2.0))], p=0.5 if view.blur_p is None else view.blur_p),
            v2.RandomSolarize(0.5, p=view.solarize_p or 0.0),
            v2.Normalize([0.5] * 3, [0.25] * 3),
        ]
    )


class MyImages(Dataset):
    """Your unlabelled images (here generated ones, 48 px): per image, the views the method asks
    for, as ``{"views": [tensor, ...]}``. No labels."""

    def __init__(self, views: tuple[ViewSpec, ...], n: int = 64) -> None:
        self.transforms = [view_transform(v) for v in views]
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, list[torch.Tensor]]:
        g = torch.Generator().manual_seed(i)
        image = torch.rand(3, 6, 6, generator=g).repeat_interleave(8, 1).repeat_interleave(8, 2)  # blocky 48 px
        return {"views": [t(image) for t in self.transforms]}


def main(max_steps: int = 4, batch_size: int = 8) -> DINO:
    """Build, train ``max_steps`` steps, and return the model (its ``eval_backbone``, the teacher,
    gives the features to evaluate)."""
    backbone = timm.create_model(  # any timm ViT, its classifier dropped; multi-crop needs dynamic_img_size
        "vit_tiny_patch16_224", num_classes=0, img_size=CROP, patch_size=8, depth=2, dynamic_img_size=True
    )
    model = DINO(
        backbone,
        hvp=HVP(num_views=4),  # 4 global candidates, 2 of each pipeline; ceil(L * 4 / 2) local candidates
        out_dim=1024,
        num_local_crops=2,
        local_crop_size=16,
        batch_size=batch_size,
        optimizer={
            "name": "adamw",
            "base_lr": 5e-4,
            "weight_decay": 0.04,
            "weight_decay_end": 0.4,
            "warmup_epochs": 0,
            "min_lr": 1e-6,
        },  # DINO's, without the warm-up a short run never ends
    )
    loader = DataLoader(MyImages(model.views()), batch_size=batch_size, shuffle=True, drop_last=True)
    trainer = L.Trainer(max_epochs=1, limit_train_batches=max_steps, logger=False, enable_checkpointing=False)
    trainer.fit(model, loader)
    return model


if __name__ == "__main__":
    trained = main()
    print(f"trained {trained.global_step} steps; features of the teacher: {trained.eval_backbone.feature_dim} wide")
