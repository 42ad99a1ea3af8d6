"""Automatic augmentation policies, per image: TrivialAugmentWide, RandAugment and
AutoAugment (AugMix, built on :class:`Policy`: :mod:`packer.augment.augmix`).

Each takes ``images``: Tensor[B, C, H, W] uint8 in [0, 255] (C = 3, or 1), on the
CPU or CUDA, and returns uint8 of the same shape on the same device. Every image
draws its own op, magnitude bin and sign, with torchvision's v2 op spaces,
magnitude tables and rules (``torchvision.transforms.v2._auto_augment``): the
op uniform over the space, the bin uniform (TrivialAugmentWide) or fixed
(RandAugment), the sign negative with probability 1/2 for the signed ops.
:meth:`sample` returns the draws (a :class:`PolicyDraw`).

Pixels (:mod:`packer.augment.policy_apply`; op spaces and draws:
:mod:`packer.augment.policy_ops`): a batch's draws come from ``generator`` on the CPU
(one seed for numpy's generator, :func:`~packer.augment.draws.host_rng`; AugMix: three
torch calls), become per-image parameters in numpy (the geometric ops'
affine matrices in float64, as torchvision computes them), and the batch's gathers go
to the device in one copy. Images are grouped by the batched op they need: the five
geometric ops (shear, translate, rotate) are one affine warp
(:mod:`packer.augment.warps`), each colour op one call of
:mod:`packer.augment.functional`. Per op stage: one gather puts the images in op
order, each op runs once on its contiguous slice, one ``cat`` joins them; one gather
restores the batch order at the end. A batch costs one call per op present, whatever
its size: at most ten for TrivialAugmentWide. On the CPU, outputs equal torchvision's
image by image.
"""

from __future__ import annotations

import numpy as np
import torch

from ..imaging.resize import check_images
from .base import _Transform
from .draws import host_rng
from .params import MAX_BINS, MAX_OPS, check_fill, count, send
from .policy_apply import (
    NCOL,
    OpPlan,
    fused_backend,
    fused_fill,
    fused_table,
    program,
    run_chain,
    run_chain_fused,
)
from .policy_ops import (
    AA_FULL_SPACE,
    AA_POLICIES,
    RA_SPACE,
    TA_SPACE,
    PolicyDraw,
    magnitude_table,
    randint,
    signed_draw,
)
from .warps import interpolation_mode


def _check_fill(fill: object) -> object:
    check_fill(fill, "fill of a policy (TrivialAugmentWide, RandAugment, AutoAugment, AugMix)")
    if fill is None or (isinstance(fill, (int, float)) and not isinstance(fill, bool)):
        return fill
    try:
        return [float(v) for v in fill]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise ValueError(
            f"fill must be None, a number or one number per channel, not {fill!r}"
        ) from None


def _check_bins(num_magnitude_bins: int) -> int:
    if isinstance(num_magnitude_bins, bool) or not isinstance(num_magnitude_bins, int):
        raise ValueError(f"num_magnitude_bins must be an int >= 2, not {num_magnitude_bins!r}")
    if num_magnitude_bins < 2:
        raise ValueError(f"num_magnitude_bins must be an int >= 2, not {num_magnitude_bins!r}")
    return count(num_magnitude_bins, "num_magnitude_bins", "policy", 2, MAX_BINS)


# ---------------------------------------------------------------- modules


class Policy(_Transform):
    """A policy of S ops per image, each from ``ops`` (torchvision's op names, in its order)."""

    def __init__(self, space: dict, interpolation: object, fill: object) -> None:
        super().__init__()
        self._space = space
        self.interpolation = interpolation_mode(interpolation, type(self).__name__)
        self.fill = _check_fill(fill)
        self._plan = OpPlan(tuple(self._space))
        # Per op index (and -1: none) whether its magnitude takes a random sign.
        self._signed = np.array([sg for _, sg in self._space.values()] + [False])
        self._tables: dict[tuple[int, int, int], np.ndarray] = {}
        self._fused_rows: dict[tuple[int, int, int, int], np.ndarray] = {}

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(self._space)

    def _table(self, num_bins: int, size: tuple[int, int] | None) -> np.ndarray:
        h, w = size if size is not None else (0, 0)
        key = (num_bins, h, w)
        t = self._tables.get(key)
        if t is None:
            if len(self._tables) > 16:  # many image sizes: keep the memory bounded
                self._tables.clear()
            t = self._tables[key] = magnitude_table(self._space, num_bins, h, w)
        return t

    def _size(self, size: tuple[int, int] | None) -> tuple[int, int]:
        if size is None:
            if any(
                spec is not None and spec[0] in ("width", "height")
                for spec, _ in self._space.values()
            ):
                raise ValueError(
                    f"{type(self).__name__}.sample needs size=(height, width): "
                    "its translations are relative to the image size"
                )
            return (0, 0)
        h, w = (int(v) for v in size)
        return h, w

    def sample(
        self,
        batch: int,
        generator: torch.Generator | None = None,
        *,
        size: tuple[int, int] | None = None,
    ) -> PolicyDraw:
        """The ops of ``batch`` images (:class:`PolicyDraw`, [B, S] each, S ops per
        image), drawn by :meth:`_draw`; ``size`` (h, w) sets the translations."""
        table = self._table(self._bins(), self._size(size))
        return signed_draw(table, *self._draw(batch, generator))

    def _draw(
        self, batch: int, generator: torch.Generator | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per image and step: the op (int64 [B, S], -1: none), its bin (int64 [B, S])
        and whether its sign is negative (bool [B, S]), from
        :func:`~packer.augment.draws.host_rng` (one draw from ``generator``)."""
        raise NotImplementedError

    def _row_index(self, batch: int, generator: torch.Generator | None) -> np.ndarray:
        """:meth:`_draw`'s draw (the same numbers) as indices into
        ``_rows(...).reshape(-1, NCOL)``, int64 [B, S] (-1 ops: the last rows, none)."""
        op, bins, negative = self._draw(batch, generator)
        index = op * self._bins()
        index += bins
        index *= 2
        index += negative
        return index

    def forward(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        check_images(images, self)
        b, _, h, w = images.shape
        return self._run(images, self.sample(b, generator, size=(h, w)), drawn=True)

    def apply(self, images: torch.Tensor, draw: PolicyDraw) -> torch.Tensor:
        """The ops of ``draw`` (from :meth:`sample`), in order, with its signed magnitudes.

        ``images``: uint8 Tensor[B, C, H, W]; returns a new uint8 tensor like it.
        """
        return self._run(images, draw, drawn=False)

    def _run(self, images: torch.Tensor, draw: PolicyDraw, drawn: bool) -> torch.Tensor:
        """``drawn``: ``draw`` comes from :meth:`sample`, so its magnitudes are its
        bins' and signs' (the fused path then looks its table rows up)."""
        check_images(images, self)
        op, mag = draw.op.numpy(), draw.magnitude.numpy()
        if op.ndim != 2 or op.shape[0] != images.shape[0] or mag.shape != op.shape:
            raise ValueError(
                f"draw.op and draw.magnitude must be [{images.shape[0]}, S], "
                f"not {tuple(op.shape)} and {tuple(mag.shape)}"
            )
        if images.shape[0] == 0 or op.shape[1] == 0:
            return images.clone()
        h, w = images.shape[-2:]
        kernels = fused_backend(images)
        if kernels is not None:
            x = self._apply_fused(kernels, images, op, mag, draw if drawn else None, None)[0]
            return x if x is not images else images.clone()
        prog = program(self._plan, op, mag, h, w)
        table = send(torch.from_numpy(prog.table), images.device)  # the one copy
        x = run_chain(images, prog, table, 0, op.shape[1], self.interpolation, self.fill)
        return x if x is not images else images.clone()

    def _apply_fused(
        self,
        kernels,
        images: torch.Tensor,
        op: np.ndarray,
        mag: np.ndarray,
        draw: PolicyDraw | None,
        extra: np.ndarray | None,
        chains: int = 1,
    ) -> tuple[torch.Tensor | list[torch.Tensor], torch.Tensor | None]:
        """``chains`` chains of ``op``'s stages through the fused kernels, each from
        ``images``; with one host-to-device copy for the table, the fill and
        ``extra`` (float32, returned on the device). One chain: its result (maybe
        ``images`` itself); several: the list of them. ``draw``: the draw from
        :meth:`sample` behind ``op`` and ``mag``, whose table rows are looked up
        (None: computed from ``op`` and ``mag``)."""
        c, h, w = images.shape[-3:]
        if draw is None:
            table, live, lut = fused_table(self._plan, op, mag, h, w, c)
        else:
            rows = self._rows(h, w, c)  # [ops + 1, bins, 2 signs, 12]
            neg = (draw.sign.numpy() < 0).astype(np.int64)
            sel = rows[op, draw.bin.numpy(), neg]  # op -1: the last row
            table = sel.transpose(1, 0, 2)
            kind = table[..., 0]
            live, lut = (kind != 0).any(1), (kind == 1).any(1)
        fill, round_nearest = fused_fill(self.fill, c, self.interpolation)
        parts = [table.ravel()]
        parts += [] if fill is None else [fill]
        parts += [] if extra is None else [extra.astype(np.float32).ravel()]
        flat = send(torch.from_numpy(np.concatenate(parts)), images.device)  # the one copy
        n = table.size
        table_dev = flat[:n].view(table.shape)
        fill_dev = None if fill is None else flat[n : n + c]
        extra_dev = None if extra is None else flat[n + (0 if fill is None else c) :]
        per = op.shape[1] // chains
        outs = [
            run_chain_fused(
                kernels,
                images,
                table_dev,
                live,
                lut,
                range(i * per, (i + 1) * per),
                fill_dev,
                self.interpolation == "bilinear",
                round_nearest,
            )
            for i in range(chains)
        ]
        return (outs[0] if chains == 1 else outs), extra_dev

    def _bins(self) -> int:
        """The number of magnitude bins of :meth:`sample`'s draws."""
        return getattr(self, "num_magnitude_bins", 10)

    def _rows(self, h: int, w: int, c: int) -> np.ndarray:
        """The fused kernels' table row of every (op, bin, sign) a draw can hold, for
        ``c`` x ``h`` x ``w`` images: float32 [ops + 1, bins, 2, 12], sign index 1
        for a negative sign, op index ``ops`` (-1) for no op. Made once per size:
        a batch's table is then one lookup instead of its numpy passes."""
        key = (self._bins(), h, w, c)
        rows = self._fused_rows.get(key)
        if rows is None:
            n, bins = len(self._space), key[0]
            mags = self._table(bins, self._size((h, w)))  # [ops, bins]
            signed = np.array([sg for _, sg in self._space.values()])
            sign = np.where(signed[:, None, None], np.array([1.0, -1.0]), 1.0)  # [ops, 1, 2]
            mag = np.broadcast_to(mags[:, :, None] * sign + 0.0, (n, bins, 2))
            op = np.broadcast_to(np.arange(n)[:, None, None], (n, bins, 2))
            t = fused_table(self._plan, op.reshape(-1, 1), mag.reshape(-1, 1), h, w, c)[0]
            rows = np.zeros((n + 1, bins, 2, NCOL), dtype=np.float32)
            rows[:n] = t.reshape(n, bins, 2, NCOL)
            none = fused_table(self._plan, np.array([[-1]]), np.zeros((1, 1)), h, w, c)[0]
            rows[n] = none[0]
            if len(self._fused_rows) > 16:  # many image sizes: keep the memory bounded
                self._fused_rows.clear()
            self._fused_rows[key] = rows
        return rows

    def _repr_fields(self) -> dict[str, object]:
        return {"interpolation": self.interpolation, "fill": self.fill}


class TrivialAugmentWide(Policy):
    """TrivialAugment (wide space), per image: one op uniform over 14, one magnitude
    bin uniform over ``num_magnitude_bins``, a random sign for the signed ops.

    As ``torchvision.transforms.v2.TrivialAugmentWide``; ``interpolation``
    ("nearest" or "bilinear": torchvision's tensor warps refuse bicubic) and ``fill``
    (None, a number or one per channel) for the geometric ops. Input and output: uint8 Tensor[B, C, H, W], same device.
    """

    def __init__(
        self, num_magnitude_bins: int = 31, interpolation: object = "nearest", fill: object = None
    ) -> None:
        super().__init__(TA_SPACE, interpolation, fill)
        self.num_magnitude_bins = _check_bins(num_magnitude_bins)

    def _repr_fields(self) -> dict[str, object]:
        return {"num_magnitude_bins": self.num_magnitude_bins, **super()._repr_fields()}

    def _draw(
        self, batch: int, generator: torch.Generator | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per image one op, bin and sign ([B, 1] each), independent and uniform."""
        op, k = np.divmod(self._code(batch, generator), 2 * self.num_magnitude_bins)
        bins, coin = np.divmod(k, 2)
        return op, bins, np.logical_and(self._signed[op], coin)

    def _code(self, batch: int, generator: torch.Generator | None) -> np.ndarray:
        """int64 [B, 1], uniform below ops x bins x 2: (op x bins + bin) x 2 + a coin
        for the sign."""
        n = len(self._space) * self.num_magnitude_bins * 2
        return randint(host_rng(generator).random((batch, 1)), n)

    def _row_index(self, batch: int, generator: torch.Generator | None) -> np.ndarray:
        # The code is the row: for an unsigned op both signs' rows are the same.
        return self._code(batch, generator)


class RandAugment(Policy):
    """RandAugment, per image: ``num_ops`` ops in a row, each uniform over 14 (with
    Identity), at the fixed bin ``magnitude`` of ``num_magnitude_bins``, each with
    a random sign for the signed ops. As ``torchvision.transforms.v2.RandAugment``.
    """

    def __init__(
        self,
        num_ops: int = 2,
        magnitude: int = 9,
        num_magnitude_bins: int = 31,
        interpolation: object = "nearest",
        fill: object = None,
    ) -> None:
        super().__init__(RA_SPACE, interpolation, fill)
        if isinstance(num_ops, bool) or not isinstance(num_ops, int) or num_ops < 0:
            raise ValueError(f"num_ops must be a non-negative int, not {num_ops!r}")
        count(num_ops, "num_ops", "RandAugment", 0, MAX_OPS)
        self.num_magnitude_bins = _check_bins(num_magnitude_bins)
        if (
            isinstance(magnitude, bool)
            or not isinstance(magnitude, int)
            or not 0 <= magnitude < num_magnitude_bins
        ):
            raise ValueError(
                f"magnitude must be an int bin in [0, {num_magnitude_bins}), not {magnitude!r}"
            )
        self.num_ops = num_ops
        self.magnitude = magnitude

    def _repr_fields(self) -> dict[str, object]:
        return {
            "num_ops": self.num_ops,
            "magnitude": self.magnitude,
            "num_magnitude_bins": self.num_magnitude_bins,
            **super()._repr_fields(),
        }

    def _draw(
        self, batch: int, generator: torch.Generator | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per image ``num_ops`` ops and signs ([B, num_ops] each) at the fixed bin:
        one integer below ops x 2 per step holds both."""
        k = randint(host_rng(generator).random((batch, self.num_ops)), 2 * len(self._space))
        op, coin = np.divmod(k, 2)
        return op, np.full_like(op, self.magnitude), np.logical_and(self._signed[op], coin)


class AutoAugment(Policy):
    """AutoAugment, per image: one of the 25 sub-policies of ``policy`` ("imagenet",
    "cifar10" or "svhn"), whose two ops each apply with their probability, at
    their bin of 10, with a random sign for the signed ops. As
    ``torchvision.transforms.v2.AutoAugment``.
    """

    def __init__(
        self, policy: object = "imagenet", interpolation: object = "nearest", fill: object = None
    ) -> None:
        super().__init__(AA_FULL_SPACE, interpolation, fill)
        name = str(getattr(policy, "value", policy))  # torchvision's AutoAugmentPolicy
        if name not in AA_POLICIES:
            raise ValueError(f"policy must be 'imagenet', 'cifar10' or 'svhn', not {policy!r}")
        self.policy = name
        names = tuple(self._space)
        pol = AA_POLICIES[name]
        self._sub_op = np.array([[names.index(o) for o, _, _ in sp] for sp in pol])
        self._sub_p = np.array([[p for _, p, _ in sp] for sp in pol])
        self._sub_bin = np.array([[0 if m is None else m for _, _, m in sp] for sp in pol])

    def _repr_fields(self) -> dict[str, object]:
        return {"policy": self.policy, **super()._repr_fields()}

    def _draw(
        self, batch: int, generator: torch.Generator | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per image its sub-policy's two ops ([B, 2] each; -1 where skipped)."""
        u = host_rng(generator).random((batch, 5))
        pol = randint(u[:, 0], len(self._sub_op))
        applied = u[:, 1:3] <= self._sub_p[pol]
        op = np.where(applied, self._sub_op[pol], -1)
        return op, self._sub_bin[pol], self._signed[op] & (u[:, 3:5] <= 0.5)
