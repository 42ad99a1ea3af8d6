"""The one table from a library field to the ``imgpack`` flag that sets it.

Library errors name the field a Python caller set (``BuildConfig.size 0x0 is out of
range``) and carry it, with every other field their message names, in ``fields``
(:class:`packer.errors.PackerError`). The CLI prints them with each field shown as the
flag a command-line user typed (``--size 0x0 is out of range``): :func:`cli_message`,
called by :func:`packer.cli.output.handle_errors` for every library error. A field with
no flag (set only from Python) is left as it is.
"""

from __future__ import annotations

import re

from ..errors import PackerError

# every CLI flag that fills a config field, by the field's qualified name
FLAGS: dict[str, str] = {
    # imgpack build
    "BuildConfig.size": "--size",
    "BuildConfig.resize": "--resize",
    "BuildConfig.workers": "--workers",
    "BuildConfig.overwrite": "--overwrite",
    "BuildConfig.max_pixels": "--max-pixels",
    "BuildConfig.classes": "--classes",
    "BuildConfig.allow_new_classes": "--allow-new-classes",
    "BuildConfig.labels": "--labels",
    "BuildConfig.targets": "--targets",
    "BuildConfig.store": "--store",
    "BuildConfig.quality": "--quality",
    "BuildConfig.max_side": "--max-side",
    "BuildConfig.device": "--device",
    "BuildConfig.shard_size": "--shard-size",
    "BuildConfig.append": "--append",
    "BuildConfig.engine": "--engine",
    "BuildConfig.ray_address": "--ray-address",
    "BuildConfig.dense": "--targets-from",
    "DenseOptions.format": "--targets-from",
    "DenseOptions.annotations": "--annotations",
    "DenseOptions.split": "--split",
    "SourceOptions.image_column": "--image-column",
    "SourceOptions.label_column": "--label-column",
    "SourceOptions.label_field": "--label-field",
    "SourceOptions.max_image_bytes": "--max-image-bytes",
    # imgpack compress
    "CompressConfig.quality": "--quality",
    "CompressConfig.max_side": "--max-side",
    "CompressConfig.workers": "--workers",
    "CompressConfig.overwrite": "--overwrite",
    "CompressConfig.max_pixels": "--max-pixels",
    # imgpack verify
    "VerifyConfig.source": "--source",
    "VerifyConfig.sample": "--sample",
    "VerifyConfig.device": "--device",
    "VerifyConfig.batch_size": "--batch-size",
    "VerifyConfig.batches": "--batches",
    # imgpack show
    "ShowConfig.out": "--out",
    "ShowConfig.per_class": "--per-class",
    "ShowConfig.max_classes": "--max-classes",
    "ShowConfig.augment": "--augment",
    "ShowConfig.random_erase": "--random-erase",
    "ShowConfig.mixup_alpha": "--mixup-alpha",
    "ShowConfig.cutmix_alpha": "--cutmix-alpha",
    "ShowConfig.draws": "--draws",
    "ShowConfig.seed": "--seed",
    # imgpack bench
    "BenchConfig.device": "--device",
    "BenchConfig.quick": "--quick",
    "BenchConfig.source": "--source",
    "BenchConfig.workers": "--workers",
    "BenchConfig.sections": "--only",
}


def cli_message(e: PackerError) -> str:
    """``str(e)`` with each field the error carries shown as its flag (those in
    :data:`FLAGS`); the message's other words are left alone."""
    text = str(e)
    for name in sorted(getattr(e, "fields", ()), key=len, reverse=True):
        flag = FLAGS.get(name)
        if flag is not None:
            text = re.sub(rf"(?<![\w.]){re.escape(name)}(?!\w)", flag, text)
    return text
