"""The base every op of the augment stage derives from, so the ops' modules (crops,
colour, geometry, erasing, policies) import it from below and never each other's.
Needs only torch, so it also imports standalone (beside ``transforms.py``)."""

from __future__ import annotations

from torch import nn


class _Transform(nn.Module):
    """An op of :mod:`packer.transforms`: called as ``op(images, generator=g)``
    (``accepts_generator``: the loader passes its per-batch generator), its repr built
    from ``_repr_fields``."""

    accepts_generator = True

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self._repr_fields().items())

    def _repr_fields(self) -> dict[str, object]:
        return {}
