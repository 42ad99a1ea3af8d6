"""AugMix, per image: chains of the AugMix space's ops, mixed with the original image.

``images``: Tensor[B, C, H, W] uint8 in [0, 255] (C = 3, or 1), on the CPU or CUDA;
returns uint8 of the same shape on the same device. As
``torchvision.transforms.v2.AugMix``, each image its own chains, depths and weights
(:class:`~packer.augment.policy_ops.AugMixDraw`); the chains run as the other
policies' ops do (:mod:`packer.augment.policy_apply`), all of them from one copy.
"""

from __future__ import annotations

import numpy as np
import torch

from ..imaging.resize import ArgumentError, check_images
from .params import MAX_ALPHA, MAX_CHAINS, count, send
from .policies import Policy
from .policy_apply import fused_backend, program, run_chain
from .policy_ops import AUGMIX_ALL, AUGMIX_PARTIAL, AugMixDraw, randint, signed_draw


class AugMix(Policy):
    """AugMix, per image: ``mixture_width`` chains of 1-3 ops (``chain_depth`` if > 0)
    from the AugMix space at a bin uniform below ``severity`` (of 10), mixed with
    Dirichlet(``alpha``) weights, then with the original image by a
    Beta(``alpha``, ``alpha``) weight. ``all_ops`` False leaves out brightness,
    colour, contrast and sharpness. As ``torchvision.transforms.v2.AugMix``: the
    mix is float32 and truncated to uint8.
    """

    _PARAMETER_MAX = 10

    def __init__(
        self,
        severity: int = 3,
        mixture_width: int = 3,
        chain_depth: int = -1,
        alpha: float = 1.0,
        all_ops: bool = True,
        interpolation: object = "bilinear",
        fill: object = None,
    ) -> None:
        super().__init__(AUGMIX_ALL if all_ops else AUGMIX_PARTIAL, interpolation, fill)
        if isinstance(severity, bool) or not isinstance(severity, int):
            raise ValueError(f"severity must be an int in [1, 10], not {severity!r}")
        if not 1 <= severity <= self._PARAMETER_MAX:
            raise ValueError(f"severity must be an int in [1, 10], not {severity!r}")
        if isinstance(mixture_width, bool) or not isinstance(mixture_width, int):
            raise ValueError(f"mixture_width must be a positive int, not {mixture_width!r}")
        if mixture_width < 1:
            raise ValueError(f"mixture_width must be a positive int, not {mixture_width!r}")
        if isinstance(chain_depth, bool) or not isinstance(chain_depth, int):
            raise ValueError(
                f"chain_depth must be an int (<= 0: 1 to 3 at random), not {chain_depth!r}"
            )
        count(mixture_width, "mixture_width", "AugMix", 1, MAX_CHAINS)
        count(chain_depth, "chain_depth (<= 0: 1 to 3 at random)", "AugMix", -(1 << 62), MAX_CHAINS)
        ok = not isinstance(alpha, bool) and isinstance(alpha, (int, float))
        if not (ok and 0 < alpha <= MAX_ALPHA):  # NaN and infinities too
            raise ArgumentError(
                f"AugMix: alpha must be a positive number at most {MAX_ALPHA:g}, not {alpha!r}"
            )
        alpha = float(alpha)
        self.severity = severity
        self.mixture_width = mixture_width
        self.chain_depth = chain_depth
        self.alpha = alpha
        self.all_ops = all_ops

    def _repr_fields(self) -> dict[str, object]:
        return {
            "severity": self.severity,
            "mixture_width": self.mixture_width,
            "chain_depth": self.chain_depth,
            "alpha": self.alpha,
            "all_ops": self.all_ops,
            **super()._repr_fields(),
        }

    @property
    def max_depth(self) -> int:
        return self.chain_depth if self.chain_depth > 0 else 3

    def sample(
        self,
        batch: int,
        generator: torch.Generator | None = None,
        *,
        size: tuple[int, int] | None = None,
    ) -> AugMixDraw:
        """Per image: the chains' ops, their depths and the mixing weights (:class:`AugMixDraw`)."""
        wd, d = self.mixture_width, self.max_depth
        conc2 = torch.full((batch, 2), self.alpha, dtype=torch.float32)
        m = torch._sample_dirichlet(conc2, generator=generator)
        concw = torch.full((batch, wd), self.alpha, dtype=torch.float32)
        w = torch._sample_dirichlet(concw, generator=generator) * m[:, 1:]
        u = torch.rand(batch, wd * (1 + 3 * d), generator=generator, dtype=torch.float64).numpy()
        if self.chain_depth > 0:
            depth = np.full((batch, wd), self.chain_depth, dtype=np.int64)
        else:
            depth = 1 + randint(u[:, :wd], 3)
        steps = np.arange(d)
        live = (steps[None, None, :] < depth[:, :, None]).reshape(batch, wd * d)
        u_op, u_bin, u_sign = np.split(u[:, wd:], 3, axis=1)
        op = np.where(live, randint(u_op, len(self._space)), -1)
        bins = randint(u_bin, self.severity)
        table = self._table(self._PARAMETER_MAX, self._size(size))
        chains = signed_draw(table, op, bins, self._signed[op] & (u_sign <= 0.5))
        return AugMixDraw(chains, torch.from_numpy(depth), torch.cat([m[:, :1], w], 1))

    # forward: Policy's (draw with sample, then _run)

    def apply(self, images: torch.Tensor, draw: AugMixDraw) -> torch.Tensor:
        """The chains and weights of ``draw`` (from :meth:`sample`) applied and mixed.

        ``images``: uint8 Tensor[B, C, H, W]; returns a new uint8 tensor like it.
        """
        return self._run(images, draw, drawn=False)

    def _run(self, images: torch.Tensor, draw: AugMixDraw, drawn: bool) -> torch.Tensor:
        check_images(images, self)
        wd, d = self.mixture_width, self.max_depth
        b, _, h, w = images.shape
        op, mag = draw.chains.op.numpy(), draw.chains.magnitude.numpy()
        if op.shape != (b, wd * d) or draw.weights.shape != (b, 1 + wd):
            raise ValueError(
                f"draw must hold [{b}, {wd * d}] chain ops and [{b}, {1 + wd}] weights, "
                f"not {tuple(op.shape)} and {tuple(draw.weights.shape)}"
            )
        if b == 0:
            return images.clone()
        kernels = fused_backend(images)
        if kernels is not None:
            chains = draw.chains if drawn else None
            xs, weights = self._apply_fused(
                kernels, images, op, mag, chains, draw.weights.numpy(), wd
            )
            weights = weights.view(-1, 1 + wd)
            mix = images * weights[:, 0, None, None, None]  # float32, as torchvision
            for i, x in enumerate(xs):
                mix.add_(weights[:, 1 + i, None, None, None] * x)
            return mix.to(torch.uint8)
        prog = program(self._plan, op, mag, h, w, chains=wd)
        # One copy for the ops' parameters and the mixing weights.
        flat = np.concatenate([prog.table.ravel(), draw.weights.numpy().ravel()])
        flat_dev = send(torch.from_numpy(flat), images.device)
        table = flat_dev[: prog.table.size].view(prog.table.shape)
        weights = flat_dev[prog.table.size :].view(-1, 1 + wd)
        mix = images * weights[:, 0, None, None, None]  # float32, as torchvision
        for i in range(wd):
            x = run_chain(images, prog, table, i, d, self.interpolation, self.fill)
            mix.add_(weights[:, 1 + i, None, None, None] * x)
        return mix.to(torch.uint8)
