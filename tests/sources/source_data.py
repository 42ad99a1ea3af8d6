"""The images of the source-format tests, written by the real writers (``datasets``'
``to_parquet`` and ``save_to_disk``, webdataset's ``ShardWriter``, ``zipfile``) in the
order a folder build reads them, and the comparison of two packs' bytes."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

from conftest import write_image
from packer.sources.scan import scan_tree


def tree(root: Path, n: int = 4) -> Path:
    """``n`` PNGs and ``n`` baseline JPEGs of assorted sizes in classes cat and dog."""
    for c in ("cat", "dog"):
        for i in range(n):
            seed = i + 10 * (c == "dog")
            write_image(root / c / f"{i}.png", (40 + 3 * i, 30 + 2 * i), seed=seed)
            write_image(root / c / f"j{i}.jpg", (50 + 5 * i, 36 + i), seed=100 + i, quality=90)
    return root


def in_order(root: Path) -> list[tuple[str, bytes, int, str]]:
    """(relative path, bytes, label, class) of the tree's images, in a folder build's order."""
    scan = scan_tree(root)
    return [
        (e.rel, (root / e.rel).read_bytes(), e.label, scan.classes[e.label]) for e in scan.entries
    ]


def image_features(names: list[str]) -> object:
    import datasets

    return datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})


def hf_dataset(root: Path) -> object:
    """A ``datasets.Dataset`` with an Image feature (bytes embedded, as on the Hub) and
    a ClassLabel, rows in folder order."""
    import datasets

    rows = in_order(root)
    return datasets.Dataset.from_dict(
        {
            "image": [{"bytes": b, "path": rel} for rel, b, _, _ in rows],
            "label": [lab for _, _, lab, _ in rows],
        },
        features=image_features(["cat", "dog"]),
    )


def write_shards(root: Path, out: Path, maxcount: int = 3, label: str = "cls") -> list[Path]:
    """WebDataset shards ``out/train-%06d.tar`` of the tree, ``maxcount`` samples each."""
    import webdataset as wds

    out.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(out / "train-%06d.tar"), maxcount=maxcount, verbose=0) as w:
        for k, (rel, data, lab, name) in enumerate(in_order(root)):
            ext = rel.rsplit(".", 1)[1]
            sample = {"__key__": f"{k:06d}", ext: data}
            if label == "cls":
                sample["cls"] = str(lab).encode()
            else:
                sample["json"] = json.dumps({label: name, "other": 1}).encode()
            w.write(sample)
    return sorted(out.glob("train-*.tar"))


def write_zip(root: Path, out: Path) -> Path:
    with zipfile.ZipFile(out, "w") as z:
        for rel, data, _, _ in in_order(root):
            z.writestr(rel, data)
    return out


def digests(pack: Path, drop: tuple[str, ...] = ()) -> dict[str, str]:
    """SHA-256 of every file of ``pack``; the manifest without its clock and source
    root (as tests/builder/test_same_bytes.py) and without the fields ``drop``."""
    out = {}
    for f in sorted(p for p in pack.rglob("*") if p.is_file()):
        data = f.read_bytes()
        if f.name == "imgpack.json":
            m = json.loads(data)
            del m["build"]["created"], m["build"]["source_root"]
            for k in drop:
                m.pop(k)
            data = json.dumps(m, sort_keys=True).encode()
        out[str(f.relative_to(pack))] = hashlib.sha256(data).hexdigest()
    return out
