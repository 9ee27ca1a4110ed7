"""torchvision's ResNets at any base width, with an optional CIFAR stem (imported when a ResNet is
built: the rest of the library needs no torchvision)."""

from __future__ import annotations

from torch import nn
from torchvision.models import resnet as tvr


class WidthResNet(tvr.ResNet):
    """torchvision ResNet with a base width other than 64 (narrow nets for CPU runs).

    Key names stay torchvision's (``conv1``, ``layer1.0.conv1`` ...), so a width-64 trunk's
    state_dict loads into ``torchvision.models.resnet18()`` unchanged.
    """

    def __init__(
        self, block: type[nn.Module], layers: list[int], width: int, cifar_stem: bool, zero_init_residual: bool = False
    ) -> None:
        self._scale = width / 64
        self._first_layer = True
        # zero_init_residual: each residual branch's last BatchNorm starts at gamma = 0 (every block
        # the identity at init; Goyal et al. 2017), as the SimCLR table of the HVP paper and the
        # official SimSiam code set it
        super().__init__(block, layers, zero_init_residual=zero_init_residual)  # type: ignore[arg-type]
        if cifar_stem:
            # CIFAR variant (SimCLR/SimSiam papers): 3x3 stride-1 stem, no max-pool.
            self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
            self.maxpool = nn.Identity()
        elif width != 64:
            self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        if width != 64:
            self.bn1 = nn.BatchNorm2d(width)
        nn.init.kaiming_normal_(self.conv1.weight, mode="fan_out", nonlinearity="relu")
        self.fc = nn.Identity()

    def _make_layer(self, block, planes, blocks, stride=1, dilate=False):  # type: ignore[override]
        if self._first_layer:
            self.inplanes = max(1, round(64 * self._scale))
            self._first_layer = False
        return super()._make_layer(block, max(1, round(planes * self._scale)), blocks, stride, dilate)


RESNETS: dict[str, tuple[type[nn.Module], list[int]]] = {
    "resnet18": (tvr.BasicBlock, [2, 2, 2, 2]),
    "resnet34": (tvr.BasicBlock, [3, 4, 6, 3]),
    "resnet50": (tvr.Bottleneck, [3, 4, 6, 3]),
}
