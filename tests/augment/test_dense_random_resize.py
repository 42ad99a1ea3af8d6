"""packer.augment.dense.RandomResize: torchvision v2's RandomResize (the shorter side
drawn in [min_size, max_size)) on every field, and the segmentation recipe's resize."""

from __future__ import annotations

import pytest
import torch
from torchvision.transforms import v2

from augment.dense_checks import assert_matches, make_sample, tv_call
from packer.augment import dense as D
from packer.imaging.resize import ArgumentError


@pytest.mark.parametrize("seed", range(6))
def test_random_resize_is_torchvisions(seed: int) -> None:
    s = make_sample(seed)
    ours = D.RandomResize(20, 70)(s, torch.Generator().manual_seed(seed))
    torch.manual_seed(seed)
    size = v2.RandomResize(20, 70).make_params([s.image])["size"]
    theirs = tv_call("resize", s, size=size, antialias=True)
    assert_matches(ours, theirs, image_tol=1)
    assert min(ours.size) == size[0]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 5), "min_size must be a positive int"),
        ((5, 5), "max_size 5 must exceed min_size 5"),
        ((5, 2.5), "max_size must be a positive int"),
    ],
)
def test_bad_sizes_name_the_op(args, match) -> None:
    with pytest.raises(ArgumentError, match=f"RandomResize: {match}"):
        D.RandomResize(*args)
