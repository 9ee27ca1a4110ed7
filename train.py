"""Pretrain a self-supervised model, optionally with Hard View Pretraining.

python train.py                                  # built-in CPU demo (SimCLR on generated textures)
python train.py +hvp=on                          # the same with hard views (N=4)
python train.py data=imagefolder data.root=PATH backbone=resnet18_cifar +hvp=on hvp.num_views=8
python train.py resume=runs/2026-11-21/10-30-00_simsiam     # continue an interrupted run
"""

from hvp_lightning.cli import train

if __name__ == "__main__":
    train()
