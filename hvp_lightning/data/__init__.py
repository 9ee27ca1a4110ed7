"""The images a run sees: datasets (generated textures, ImageFolder, unlabelled folders, WebDataset
tar shards read by byte range and their converter ``hvp-make-shards``, torchvision sets, devices'
resident copies), the view augmentation with recorded parameters (host and batched GPU steps,
the IoU policy, iBOT's masks), samplers that resume mid-epoch, the data module, and the fork
server its loader workers start from.

Imports ``run/`` (job signals, the process's rank) and the leaves only: the fork server preloads
these modules, so they stay free of Lightning (tests/test_workers.py). No re-exports here.
"""
