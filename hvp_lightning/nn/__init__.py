"""The networks and what trains them, with no method or run attached: backbones (ResNets with
the CIFAR stem, ViTs and their token forward), projection / prediction / DINO / iBOT heads,
the weighted k-NN classifier, the label-free health monitors (RankMe, feature std),
optimisers (LARS by name) with the warm-up + cosine schedule,
the teacher-student machinery (EMA teacher, centring, teacher temperature, clipping), the
oneDNN AVX2 1x1-convolution guard, the step's sync-free host-to-device helpers and the
model-FLOP counter (``flops``).

Imports only torch, torchvision, Lightning and the package's leaves (``schema``); ``cluster/``,
``selection/``, ``methods/`` and ``evaluation/`` build on it.
"""
