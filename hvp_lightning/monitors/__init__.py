"""What a run watches its features with while it trains: the weighted k-NN classifier (DINO's
``eval_knn``), the label-free health monitors (RankMe, feature std) and the Lightning callback that
runs both at every validation pass and keeps their records (:class:`.online.OnlineMonitors`).

Imports ``run/`` (the run dir, atomic writes) and libraries; ``analysis/``, ``training/`` and
``evaluation/`` use it. No re-exports here.
"""
