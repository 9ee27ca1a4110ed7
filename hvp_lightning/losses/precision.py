"""Stand-in until the losses layer lands on main (its precision.py replaces this file)."""

from ..selection.forward_pass import exact_fp32

__all__ = ["exact_fp32"]
