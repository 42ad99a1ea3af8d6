"""``imgpack info``: what a pack holds, and how ``packer.split`` would cut it."""

from __future__ import annotations

import click

from ..errors import UsageError
from .options import json_option
from .output import emit_json, handle_errors, human_bytes


def _parse_fractions(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise UsageError(
            f"--split {text!r}: give fractions separated by commas that sum to 1, e.g. 0.9,0.1"
        ) from None


@click.command()
@click.argument("pack", type=click.Path())  # a str: an s3:// URL keeps its "//"
@click.option(
    "--split",
    "split_text",
    metavar="F1,F2,...",
    help="Also show the class histogram of each part of packer.split(PACK, fractions, "
    "seed) (stratified by label), e.g. 0.9,0.1.",
)
@click.option("--seed", type=int, default=None, help="Seed of --split (default 0).")
@click.option(
    "--sample",
    type=click.IntRange(0),
    default=1000,
    show_default=True,
    help="Packs with semantic masks: the pixel-class histogram reads this many images, "
    "spread evenly over the pack (0: every image).",
)
@json_option()
@handle_errors
def info(pack: str, split_text: str | None, seed: int | None, sample: int, as_json: bool) -> None:
    """Show what a pack holds: count, shape, class map, targets, size on disk, build options.

    With --split, also each part's size and class histogram, as packer.split
    cuts it (the same seed gives the same parts in Python).

    A pack with dense targets (built with --targets-from) also shows its instances
    per category, boxes per image (min, median, max), crowd and keypoint instances,
    whether it holds instance masks, and for semantic masks the share of pixels of
    each class and of the ignore value, over --sample images.

    \b
    Examples:
      imgpack info ./tensors
      imgpack info ./tensors --json | jq .class_counts
      imgpack info ./tensors --split 0.9,0.1 --seed 1
      imgpack info s3://bucket/train                # a set in object storage
    """
    from ..storage.open import describe, load, where

    if seed is not None and split_text is None:
        raise UsageError("--seed is the seed of --split; give --split too, e.g. --split 0.9,0.1")
    fractions = _parse_fractions(split_text) if split_text is not None else None
    out = describe(pack)
    located = where(pack)
    dense = None
    if located.kind != "url":  # a pack with dense targets: read their columns (numpy)
        from ..pack.dense_info import dense_summary

        dense = dense_summary(located.path, sample=sample)
    if dense is not None:
        out["dense"] = dense
    splits = None
    if fractions is not None:
        from ..loading.dataset import class_histogram, split

        try:
            opened = load(pack)  # once: the split and every histogram read it
            parts = split(opened, fractions, seed=seed or 0, stratify=True)
        except UsageError as e:
            raise UsageError(f"--split {split_text}: {e}") from None
        splits = [
            {"fraction": f, "count": len(part), "class_counts": class_histogram(opened, part)}
            for f, part in zip(fractions, parts)
        ]
    if as_json:
        if splits is not None:
            out["splits"] = splits
        emit_json(out)
        return
    c, h, w = out["image_shape"]
    b = out["build"]
    click.echo(f"pack      {pack}")
    from ..pack.kinds import kind_of

    if kind_of(out.get("storage", "raw")).decoded:  # info names only other kinds than raw
        click.echo(f"images    {out['count']} JPEG files, up to {h}x{w} (decoded when read)")
    else:
        click.echo(f"images    {out['count']} x {c}x{h}x{w} uint8 ({b['resize']})")
    click.echo(f"on disk   {human_bytes(out['bytes'])}")
    if out.get("shards"):
        sh = out["shards"]
        n = sh["images"]
        click.echo(f"shards    {sh['count']} ({n['min']} to {n['max']} images each)")
    if b.get("labels_table"):
        click.echo(
            f"labels    from {b['labels_table']} ({b.get('unlisted', 0)} images under the "
            "source had no row: ignored)"
        )
    if out["classes"]:
        click.echo(f"classes   {len(out['classes'])} (index, images, name)")
        for name, idx in out["class_to_idx"].items():
            click.echo(f"  {idx:>4}  {out['class_counts'][name]:>8}  {name}")
    elif b.get("labels_table"):
        click.echo("classes   none (integer labels from the table; -1 = no label)")
    else:
        click.echo("classes   none (flat folder; labels are -1)")
    t = out["targets"]
    if t:
        click.echo(f"targets   {t['dtype']} {t['shape']}: {', '.join(t['names'])}")
    if out.get("shards"):  # a set records its options, not one build's source and time
        opts = ", ".join(f"{k} {v}" for k, v in b.items() if v is not None)
        click.echo(f"built     with {opts} (set format {out['format_version']})")
    else:
        click.echo(
            f"built     from {b.get('source_root')} at {b.get('created')} "
            f"(imgpack {b.get('imgpack_version')}, format {out['format_version']})"
        )
    if dense is not None:
        _echo_dense(dense)
    click.echo(f"skipped   {len(out['skipped'])}")
    for s in out["skipped"][:20]:
        click.echo(f"  {s['path']}: {s['reason']}")
    if splits is not None:
        click.echo(f"split     {split_text} (seed {seed or 0}, stratified by label)")
        for k, part in enumerate(splits, 1):
            click.echo(f"  part {k}  {part['fraction']:g}: {part['count']} images (images, label)")
            for name, count in part["class_counts"].items():
                click.echo(f"    {count:>8}  {name}")


def _echo_dense(d: dict) -> None:
    b = d["boxes_per_image"]
    click.echo(
        f"instances {d['instances']} in {d['images']} images (boxes per image: min {b['min']}, "
        f"median {b['median']:g}, max {b['max']}); crowd {d['crowd']}, with keypoints "
        f"{d['keypoint_instances']}, masks {'yes' if d['masks'] else 'no'}"
    )
    if d["dropped"]:
        click.echo(f"          {d['dropped']} boxes fell outside the resized images (dropped)")
    click.echo(f"categories {len(d['categories'])} (instances, name)")
    for name, count in d["categories"].items():
        click.echo(f"  {count:>8}  {name}")
    s = d["semantic"]
    if s is not None:
        click.echo(
            f"pixels    of {s['images']} of {s['of']} images' semantic masks (share, class); "
            f"ignore ({s['ignore_index']}) {s['ignore_share']:.2%}"
        )
        for name, share in s["classes"].items():
            click.echo(f"  {share:>8.2%}  {name}")
