"""How much of the candidate-pair loss each pair metric explains (paper section 6).

Why not fANOVA itself: the paper used fANOVA (Hutter et al., 2014); its package (``fanova``,
last release 2020) needs ``pyrfr``, a C++ random forest without wheels for current Pythons,
so it is not a maintainable dependency. We compute the same quantity with scikit-learn: fit
a random forest to the data, then take each feature's *main-effect variance share* -- the
variance of its partial-dependence curve (evaluated on the feature's quantiles, i.e. under
its empirical marginal) divided by the variance of the forest's predictions. That is
fANOVA's first-order importance, with the empirical feature distribution instead of a
uniform one, and comparable to the paper's percentages. We also report scikit-learn's
permutation importance (drop in held-out R^2), which needs no independence assumption. Held
out are whole images at a step: the candidate pairs of one image share views and their centred
losses sum to zero, so pairs of one image on both sides of the split would inflate the R^2. The
target is the candidate pair's loss *centred per image and step* (minus the mean over that
image's candidate pairs), because HVP compares pairs of the same image at the same step:
training progress and image content would otherwise dominate the variance.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .callback import PAIR_FEATURES


def importance(
    pairs: dict[str, np.ndarray],
    features: Sequence[str] = PAIR_FEATURES,
    trees: int = 100,
    max_samples: int = 200_000,
    grid: int = 20,
    seed: int = 0,
) -> dict[str, Any]:
    """Main-effect variance shares and permutation importances of the pair ``features`` for the
    per-image-centred candidate-pair loss (see the module docstring for the method)."""
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.inspection import permutation_importance

    ok = pairs["hvp"] & np.isfinite(pairs["loss"])
    if ok.sum() < 50:
        return {"skipped": f"only {int(ok.sum())} scored candidate pairs logged (need >= 50)"}
    micro = pairs["micro"][ok].astype(np.int64) if "micro" in pairs else np.zeros(int(ok.sum()), np.int64)
    key = np.stack(
        [pairs["rank"][ok].astype(np.int64), pairs["step"][ok], micro, pairs["sample"][ok].astype(np.int64)], 1
    )
    _, group = np.unique(key, axis=0, return_inverse=True)
    group = group.reshape(-1)
    loss = pairs["loss"][ok].astype(np.float64)
    y = loss - (np.bincount(group, loss) / np.bincount(group))[group]
    x = np.stack([pairs[f][ok].astype(np.float64) for f in features], 1)
    rng = np.random.default_rng(seed)
    if len(y) > max_samples:
        pick = rng.choice(len(y), max_samples, replace=False)
        x, y, group = x[pick], y[pick], group[pick]
    if len(np.unique(group)) < 2:
        return {"skipped": "one image at one step only: nothing to hold out"}
    train, test = split_by_group(group, test_size=0.25, seed=seed)
    x_tr, x_te, y_tr, y_te = x[train], x[test], y[train], y[test]
    rf = RandomForestRegressor(
        n_estimators=trees,
        min_samples_leaf=max(5, len(y_tr) // 2000),
        max_features=0.5,
        max_samples=min(1.0, 50_000 / len(y_tr)),
        n_jobs=-1,
        random_state=seed,
    )
    rf.fit(x_tr, y_tr)
    r2 = float(rf.score(x_te, y_te))
    ref = x_te[rng.choice(len(x_te), min(len(x_te), 1000), replace=False)]
    total = float(np.var(rf.predict(x_te)))
    main: dict[str, float] = {}
    qs = (np.arange(grid) + 0.5) / grid
    for j, f in enumerate(features):
        values = np.quantile(x_te[:, j], qs)
        probe = np.repeat(ref[None], grid, 0)
        probe[:, :, j] = values[:, None]
        pd = rf.predict(probe.reshape(-1, x.shape[1])).reshape(grid, -1).mean(1)
        main[f] = float(np.var(pd) / total) if total > 0 else 0.0
    n_perm = min(len(x_te), 20_000)
    perm = permutation_importance(rf, x_te[:n_perm], y_te[:n_perm], n_repeats=5, random_state=seed, n_jobs=1)
    return {
        "method": "random forest (scikit-learn) surrogate; main effect = Var(partial dependence on the feature's "
        "quantiles) / Var(prediction) (fANOVA-like first-order share); permutation = held-out R^2 drop",
        "target": "candidate-pair loss minus the mean over the same image's candidate pairs (same step)",
        "features": list(features),
        "n_samples": int(len(y)),
        "r2_test": r2,
        "main_effect": main,
        "main_effect_total": float(sum(main.values())),
        "permutation": {f: float(v) for f, v in zip(features, perm.importances_mean)},
        "permutation_std": {f: float(v) for f, v in zip(features, perm.importances_std)},
    }


def split_by_group(group: np.ndarray, test_size: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) row indices with every group (an image at a step) wholly on one side, about
    ``test_size`` of the groups held out (scikit-learn's ``GroupShuffleSplit``)."""
    from sklearn.model_selection import GroupShuffleSplit

    split = GroupShuffleSplit(n_splits=1, test_size=test_size, random_state=seed)
    train, test = next(split.split(np.zeros((len(group), 1)), groups=group))
    return train, test
