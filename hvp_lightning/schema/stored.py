"""A config a run stored (in its checkpoints) read by this version: keys the run's version did not
have yet take the value that version's code used, not today's default.

A later key's default is what a new run gets; a run written before the key existed ran as its
own code did, and resuming, evaluating or exporting it must go on the same way. Keys missing here
had, before they existed, the behaviour of their default.
"""

from __future__ import annotations

from typing import Any

# dotted key -> the value a run of a version without the key used
EARLIER_VALUES: dict[str, Any] = {
    "backbone.zero_init_residual": False,  # every BatchNorm started at 1
    "method.clip_grad_kind": "per_parameter",  # DINO/iBOT clipped each parameter on its own
    "method.hvp_max_combinations": None,  # DINO scored the combinations hvp.max_combinations said
    "method.compile": False,
    "hvp.global_pairs": "all",  # DINO/iBOT scored every pair of global candidates
    "data.on_device": False,
    "logger.gallery_images": 0,  # no live gallery
}


def with_earlier_values(config: dict[str, Any], declared: Any) -> list[str]:
    """Give ``config`` (a stored training config, plain values; changed in place) the values of
    :data:`EARLIER_VALUES` it lacks, where its section declares the key (``declared(section,
    key)``); the dotted keys given."""
    given = []
    for dotted, value in EARLIER_VALUES.items():
        section, key = dotted.split(".")
        node = config.get(section)
        if isinstance(node, dict) and key not in node and declared(section, node, key):
            node[key] = value
            given.append(dotted)
    return given
