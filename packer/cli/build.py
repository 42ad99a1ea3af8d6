"""``imgpack build``: decode and resize every image of a folder into a pack."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import click

from ..pack.layout import STORAGE_KINDS
from .options import QualityHint, device_option, json_option, quiet_option, workers_option
from .output import LOADED_AT, handle_errors, report, run_with_bar, sigterm_as_interrupt


def _parse_size(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, int]:
    from ..builder.config import parse_size

    try:
        return parse_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@click.command(cls=QualityHint)
# strs: a bucket SRC (s3://) keeps its "//"; several: parquet files, tar shards
@click.argument("srcs", metavar="SRC...", nargs=-1, required=True)
@click.argument("dst", type=click.Path())  # a str: an s3:// URL keeps its "//"
@click.option(
    "--size",
    default="224",
    show_default=True,
    callback=_parse_size,
    help="Output size: S for S×S, or WxH (width x height), in pixels. torchvision's "
    "ImageNet recipe (RandomResizedCrop(224) to train, Resize(256) + CenterCrop(224) to "
    "validate) needs --size 256, cropped to 224 by the loader's transforms; 224 suits "
    "models fed the stored images as they are.",
)
@click.option(
    "--resize",
    type=click.Choice(["crop", "stretch", "pad"]),
    default="crop",
    show_default=True,
    help="crop: scale the shorter side, take the centre. stretch: ignore aspect. "
    "pad: scale the longer side, letterbox with black.",
)
@workers_option("Decoding processes [default: all cores].")
@click.option(
    "--max-pixels",
    type=click.IntRange(1),
    default=100_000_000,
    show_default=True,
    help="Skip images larger than this (decompression-bomb guard).",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing pack at DST.")
@click.option("--strict", is_flag=True, help="Exit 1 if any image was skipped.")
@json_option()
@quiet_option()
@click.option(
    "--classes",
    "class_map",
    type=click.Path(),
    default=None,
    help="Fix the class -> index map: a text file (one class name per line, in index "
    "order) or an existing pack or pack set (also s3://...), whose map is reused.",
)
@click.option(
    "--allow-new-classes",
    is_flag=True,
    help="Append classes missing from the --classes map at the end instead of refusing them.",
)
@click.option(
    "--labels",
    "labels_table",
    type=click.Path(path_type=Path),
    default=None,
    help="Labels from a table (.csv, .tsv, .parquet) with a 'path' column (relative to "
    "SRC) and a 'label' column (class names or integers), instead of class folders.",
)
@click.option(
    "--targets",
    default=None,
    help="Comma-separated numeric columns of the --labels table, stored as a float32 "
    "targets [N, K] field.",
)
@click.option(
    "--store",
    type=click.Choice(list(STORAGE_KINDS)),
    default="raw",
    show_default=True,
    help="raw: decoded uint8 rows of --size (a crop keeps only the centre). jpeg: each "
    "image's JPEG file (whole image, decoded and cropped in batches when read; --size is "
    "then unused): for RandomResizedCrop over the whole image, as torchvision trains.",
)
@click.option(
    "--quality",
    "-Q",
    type=click.IntRange(2, 31),
    default=3,
    show_default=True,
    help="--store jpeg: quality of re-encoded inputs (non-JPEG, CMYK, EXIF-rotated, "
    "over --max-side), compress's scale: 2 best .. 31 worst (Pillow quality 100-3*Q).",
)
@click.option(
    "--max-side",
    type=click.IntRange(1),
    default=None,
    help="--store jpeg: longest stored side in pixels; larger images are scaled down "
    "and re-encoded. For RandomResizedCrop 224 from ~2 MP photos, 1024 streams faster "
    "in fewer bytes with almost no crop upsampled; 512 upsamples many crops "
    "(docs/PERFORMANCE.md, section '--max-side').",
)
@click.option(
    "--shard-size",
    metavar="SIZE",
    default=None,
    help="Write a pack set at DST: an index (written last) and immutable shards of about "
    "SIZE each (256MB, 1GB, 512MiB; raw: a fixed image count per shard, jpeg: by source "
    "bytes). A killed build resumes at the first unfinished shard.",
)
@click.option(
    "--append",
    is_flag=True,
    help="Add the images under SRC that the pack set at DST does not hold yet, as new "
    "shards (same options and class map, else refused; old shards are never rewritten). "
    "Removing images is not supported: build a new set.",
)
@click.option(
    "--engine",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Who builds a pack set's shards: local (this machine's cores) or ray (one Ray task "
    "per shard on a cluster, --workers CPUs each [default: 1]; needs pip install "
    "'imgpack[ray]', SRC readable and DST writable by every node at the same path). Same "
    "bytes either way; always a set.",
)
@click.option(
    "--ray-address",
    metavar="ADDR",
    default=None,
    help="--engine ray: the cluster to join (host:port of `ray start --head`) [default: "
    "RAY_ADDRESS, else a one-machine cluster started for this build].",
)
@click.option(
    "--image-column",
    default=None,
    help="Parquet/Arrow SRC: the column holding the images (an Image feature or binary), "
    "where the schema does not say.",
)
@click.option(
    "--label-column",
    default=None,
    help="Parquet/Arrow SRC: the column holding the labels (a ClassLabel, integers or "
    "strings), where the schema does not say.",
)
@click.option(
    "--label-field",
    default=None,
    help="WebDataset SRC: take each sample's label from this field of its json member "
    "[default: its cls member].",
)
@click.option(
    "--max-image-bytes",
    metavar="SIZE",
    default="256MiB",
    show_default=True,
    help="Parquet/tar/zip/bucket SRC: skip an image (a cell, member or object) larger "
    "than this, unread.",
)
@click.option(
    "--targets-from",
    type=click.Choice(["auto", "coco", "yolo", "voc", "masks"]),
    default=None,
    help="Build boxes, labels, masks and keypoints from SRC's annotations (COCO JSON, "
    "YOLO, Pascal VOC, or image + mask folders), moved as each image is resized [default: "
    "when SRC is unmistakably COCO, YOLO or VOC]. --classes then takes a category map "
    "JSON or a pack built with one.",
)
@click.option(
    "--annotations",
    "annotations_file",
    type=click.Path(path_type=Path),
    default=None,
    help="The COCO JSON to read (else annotations/instances_*.json under SRC).",
)
@click.option(
    "--split",
    "ann_split",
    default=None,
    help="With annotations: the split to read (train2017; YOLO's images/<split>; VOC's "
    "ImageSets/Main/<split>.txt).",
)
@device_option(
    "cpu: decode in worker processes (bit-exact, the default). cuda: JPEGs decoded and "
    "resized on the GPU in batches, other inputs on the CPU workers (pixels within the "
    "tolerance in docs). auto: cuda where a GPU is there and the job is large enough to "
    "finish sooner on it (from about 90k images on 16 workers), else cpu.",
    default="cpu",
)
@handle_errors
@sigterm_as_interrupt
def build(
    srcs: tuple[str, ...],
    dst: str,
    size: tuple[int, int],
    resize: str,
    workers: int | None,
    max_pixels: int,
    overwrite: bool,
    strict: bool,
    as_json: bool,
    quiet: bool,
    class_map: str | None,
    allow_new_classes: bool,
    labels_table: Path | None,
    targets: str | None,
    store: str,
    quality: int,
    max_side: int | None,
    shard_size: str | None,
    append: bool,
    engine: str,
    ray_address: str | None,
    device: str,
    image_column: str | None,
    label_column: str | None,
    label_field: str | None,
    max_image_bytes: str,
    targets_from: str | None,
    annotations_file: Path | None,
    ann_split: str | None,
) -> None:
    """Decode and resize every image under SRC into a pack at DST.

    SRC is an ImageFolder tree (one subfolder per class; labels are the sorted
    folder indices, as torchvision's ImageFolder assigns them) or a flat folder
    of images (labels -1); or parquet files, a datasets save_to_disk folder,
    WebDataset tar shards (brace ranges: 'train-{000000..000127}.tar') or a zip,
    local or in a bucket (s3://), read in place. --classes fixes the indices instead, so a val split
    missing a class keeps train's: build every split after the first with
    --classes FIRST_PACK. --labels takes the labels from a table; its
    rows whose file is missing are skipped, images it does not list are ignored.
    Images that cannot be decoded are skipped and listed.
    An interrupted build resumes when the same command is run again.

    \b
    Examples:
      imgpack build ./imgs ./tensors
      imgpack build ./train ./train_pack --size 256      # RandomResizedCrop(224) later
      imgpack build ./train ./train_jpeg --store jpeg    # crops over the whole image
      imgpack build ./imgs ./tensors --size 320x240 --resize pad --workers 8
      imgpack build ./imgs ./tensors --overwrite --json > build.json
      imgpack build ./val ./val_pack --classes ./train_pack
      imgpack build ./imgs ./tensors --labels labels.csv --targets age,score
      imgpack build ./small ./jpeg_pack --store jpeg --max-side 512
      imgpack build ./small ./tensors --device cuda
      imgpack build data/train-*.parquet ./train_pack         # Hugging Face parquet
      imgpack build 'shards/train-{000000..000127}.tar' ./pack  # WebDataset shards
      imgpack build photos.zip ./pack
      imgpack build ./train ./train_set --shard-size 256MB   # a pack set of shards
      imgpack build ./new_week ./train_set --append          # new images, new shards
      imgpack build /shared/train /shared/train_set --engine ray --ray-address head:6379
      imgpack build ./train s3://bucket/train --shard-size 256MB   # into object storage
      imgpack build ./coco ./coco_pack --targets-from coco --size 512 --resize pad
    """
    marks = {"cli_loaded": LOADED_AT, "cli_command": time.perf_counter()}
    from ..builder import api
    from ..builder.config import BuildConfig
    from ..builder.formats.options import SourceOptions
    from ..builder.sizes import parse_bytes
    from ..builder.timeline import write_cli_timeline
    from ..builder.workdir import refuse_symlink_destination
    from ..storage.url import is_url

    src = srcs[0] if len(srcs) == 1 else list(srcs)  # type: ignore[assignment]
    dense = None
    if targets_from is not None or annotations_file is not None or ann_split is not None:
        from ..builder.dense import DenseOptions  # its readers load only for such a build

        dense = DenseOptions(
            format=targets_from or "auto", annotations=annotations_file, split=ann_split
        )
    if not is_url(dst):
        dst = Path(dst)  # type: ignore[assignment]
        refuse_symlink_destination(dst)  # before the scan; build() checks again under its lock
    config = BuildConfig(
        size=size,
        resize=resize,
        workers=workers,
        overwrite=overwrite,
        max_pixels=max_pixels,
        classes=class_map,
        allow_new_classes=allow_new_classes,
        labels=labels_table,
        targets=tuple(c.strip() for c in targets.split(",")) if targets is not None else (),
        store=store,
        quality=quality,
        max_side=max_side,
        shard_size=parse_bytes(shard_size) if shard_size is not None else None,
        append=append,
        engine=engine,
        ray_address=ray_address,
        device=device,
        sources=SourceOptions(
            image_column=image_column,
            label_column=label_column,
            label_field=label_field,
            max_image_bytes=parse_bytes(max_image_bytes, "--max-image-bytes"),
        ),
        dense=dense,
    )
    run = functools.partial(api.build, src, dst, config)
    marks["build_called"] = time.perf_counter()
    result = run_with_bar("build", quiet, as_json, run, shards=api.route(src, dst, config).sharded)
    marks["build_returned"] = time.perf_counter()
    write_cli_timeline(marks, result.extra)  # IMGPACK_BUILD_TIMELINE (benchmarks) only
    from ..pack.kinds import kind_of

    if kind_of(result.storage).decoded:  # each image keeps its own size: say the largest
        h, w = result.image_shape[1:]
        what = f"JPEG images (their own sizes, up to {w} wide x {h} high; decoded when read)"
    else:
        what = f"images of {'x'.join(map(str, result.image_shape))}"
    summary = (
        f"Packed {result.count} {what} into {dst} in {result.seconds:.1f} s"
        + (f" ({len(result.skipped)} skipped, bad input)" if result.skipped else "")
        + (f" ({result.ignored} not in {labels_table}: ignored)" if labels_table else "")
        + (f" (resumed: {result.resumed} already done)" if result.resumed else "")
        + (f" in {result.shards} shards" if result.shards else "")
    )
    if result.dense is not None:
        d = result.dense
        summary += (
            f"\nTargets from {d['format']}: {d['instances']} instances of "
            f"{len(d['categories'])} categories"
            + (f", {d['dropped']} boxes dropped by the resize" if d.get("dropped") else "")
        )
    if result.new_classes:
        summary += f"\nAppended to the class map: {', '.join(result.new_classes)}"
    inferred = {
        "folders": f"the folders of {src}",
        "labels": f"the label names in {labels_table}",
        "source": f"the label names in {src}",  # a parquet/tar source's names (packer.sources)
    }
    if result.classes_from in inferred and not quiet:
        # labels are indices into a map sorted from what this SRC holds: a split missing
        # a class shifts the rest, so say where the map came from and how to pin it
        note = (
            f"classes: {len(result.classes)} inferred from {inferred[result.classes_from]}; "
            "for a split that must match another pack's labels, pass --classes TRAIN_PACK"
        )
        if as_json:
            click.echo(note, err=True)  # stdout holds the JSON alone
        else:
            summary += f"\n{note}"
    report(result, summary, skipped=result.skipped, as_json=as_json, quiet=quiet, strict=strict)
