"""``imgpack show``: a contact sheet of a pack's images, optionally augmented."""

from __future__ import annotations

from pathlib import Path

import click

from .options import check_output, json_option
from .output import emit_json, handle_errors


@click.command()
@click.argument("pack", type=click.Path(path_type=Path))
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    required=True,
    help="The PNG to write (written whole: a temporary name, then renamed).",
)
@click.option("--per-class", type=click.IntRange(1), default=4, show_default=True)
@click.option(
    "--max-classes",
    type=click.IntRange(1),
    default=20,
    show_default=True,
    help="Show the first N classes only.",
)
@click.option(
    "--augment",
    type=click.Choice(["ta_wide", "ra", "imagenet", "augmix", "hflip", "lsj", "ssd"]),
    default=None,
    help="Show draws of TrivialAugmentWide, RandAugment, AutoAugment('imagenet') or AugMix; "
    "for a pack with boxes and masks (built with --targets-from), of the detection "
    "reference's hflip, lsj (scale jitter to 224) or ssd, the targets moved with the image.",
)
@click.option(
    "--random-erase",
    type=click.FloatRange(0, 1),
    default=0.0,
    help="Show draws of RandomErasing(p=P).",
)
@click.option(
    "--mixup-alpha", type=click.FloatRange(0), default=0.0, help="Show MixUp(alpha=A) draws."
)
@click.option(
    "--cutmix-alpha", type=click.FloatRange(0), default=0.0, help="Show CutMix(alpha=A) draws."
)
@click.option(
    "--draws", type=click.IntRange(1), default=4, show_default=True, help="Draws per image."
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="Pick each class's images at random with this seed (and seed the draws) "
    "[default: the first of each class, draws seeded by 0].",
)
@json_option()
@handle_errors
def show(
    pack: Path,
    out: Path,
    per_class: int,
    max_classes: int,
    augment: str | None,
    random_erase: float,
    mixup_alpha: float,
    cutmix_alpha: float,
    draws: int,
    seed: int | None,
    as_json: bool,
) -> None:
    """Draw a contact sheet of PACK: --per-class images of each class, with class names.

    Raw and JPEG packs, on the CPU. With --augment, --random-erase, --mixup-alpha or
    --cutmix-alpha, each image is shown as stored next to --draws augmented versions
    (packer.transforms' ops, each image its own draw; a mixer's draws are captioned
    with their two heaviest classes). Needs matplotlib: pip install 'imgpack[plot]'.

    A pack built with --targets-from has its targets drawn on each image: boxes
    and category names, instance masks and semantic masks as translucent overlays,
    keypoints; a row per category, of images holding it. --augment hflip, lsj or
    ssd shows draws of that dense transform with the targets moved with the image.

    \b
    Examples:
      imgpack show train256/ --out grid.png
      imgpack show train256/ --out ta.png --per-class 1 --augment ta_wide --random-erase 0.25
      imgpack show train256/ --out mix.png --mixup-alpha 0.2 --cutmix-alpha 1.0 --seed 3
      imgpack show coco_pack/ --out boxes.png --augment lsj --per-class 2
    """
    from ..measure.show import ShowConfig, show_pack

    check_output(out, "--out")
    config = ShowConfig(
        pack=pack,
        out=out,
        per_class=per_class,
        max_classes=max_classes,
        augment=augment,
        random_erase=random_erase,
        mixup_alpha=mixup_alpha,
        cutmix_alpha=cutmix_alpha,
        draws=draws,
        seed=seed,
    )
    result = show_pack(config)
    if as_json:
        emit_json(result.to_json())
    else:
        what = f", {result.draws} draws each" if result.draws else ""
        classes = len(dict.fromkeys(result.classes))
        click.echo(
            f"Wrote {out}: {result.images} images of {classes} classes{what} "
            f"({result.width}x{result.height} px)"
        )
