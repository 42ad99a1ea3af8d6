"""Categories of an annotated source (:mod:`packer.sources.annotations.model` has the
rest of the model): :class:`CategoryMap` (contiguous indices ``0..C-1``, names, the
source's original ids, keypoint names, a per-category ``flip_map``; saved and loaded as
JSON or a names file), :func:`derive_flip_map` (left/right keypoint pairs by name),
:func:`load_category_map` and :func:`resolve_categories` (``BuildConfig.classes``'
rules: a given map is fixed, its order wins, new categories only when allowed).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._fs import loads_json, write_atomic
from ...errors import InputError
from ..common import control_char, read_regular

CATEGORY_MAP_FORMAT = "imgpack-categories"
CATEGORY_MAP_VERSION = 1
DEFAULT_MAX_FILE_BYTES = 64 << 20  # one annotation file (AnnotationConfig.max_file_bytes)

_SIDE_RE = re.compile(r"(?<![a-z])(left|right)(?![a-z])", re.IGNORECASE)


def derive_flip_map(keypoints: Sequence[str]) -> tuple[tuple[int, int], ...]:
    """The (left, right) index pairs of ``keypoints`` whose names differ only in a
    ``left``/``right`` word (COCO's ``left_eye``/``right_eye``), in keypoint order."""
    index = {n: i for i, n in enumerate(keypoints)}
    pairs = []
    for i, name in enumerate(keypoints):
        m = _SIDE_RE.search(name)
        if m is None or m.group(1).lower() != "left":
            continue
        word = m.group(1)
        other = "right" if word == "left" else "Right" if word == "Left" else "RIGHT"
        j = index.get(name[: m.start()] + other + name[m.end() :])
        if j is not None:
            pairs.append((i, j))
    return tuple(pairs)


@dataclass(frozen=True)
class CategoryMap:
    """Categories by contiguous index ``0..C-1``.

    ``names[i]``: the name of index ``i``; ``ids[i]``: the source's id of it (COCO's
    ``category_id``, YOLO's class number, a mask's pixel value; the index where the
    source has none); ``keypoints[i]``: its keypoint names (``()`` for none);
    ``flip_map[i]``: its (left, right) keypoint index pairs (``()`` for none).
    """

    names: tuple[str, ...]
    ids: tuple[int, ...]
    keypoints: tuple[tuple[str, ...], ...] = ()
    flip_map: tuple[tuple[tuple[int, int], ...], ...] = ()

    def __post_init__(self) -> None:
        c = len(self.names)
        if not self.keypoints:
            object.__setattr__(self, "keypoints", ((),) * c)
        if not self.flip_map:
            object.__setattr__(self, "flip_map", ((),) * c)
        if not (len(self.ids) == len(self.keypoints) == len(self.flip_map) == c):
            raise InputError(
                f"a category map needs one id, keypoint list and flip_map per name; "
                f"got {c} names, {len(self.ids)} ids, {len(self.keypoints)} keypoint lists, "
                f"{len(self.flip_map)} flip maps"
            )
        seen: dict[str, int] = {}
        for i, name in enumerate(self.names):
            if not isinstance(name, str) or not name.strip() or name != name.strip():
                raise InputError(
                    f"category {i}: name {name!r} must be non-empty text without surrounding spaces"
                )
            bad = control_char(name)
            if bad is not None:
                raise InputError(f"category {i}: name {name!r} holds the control character {bad!r}")
            if name in seen:
                raise InputError(
                    f"category name {name!r} appears twice (indices {seen[name]} and {i}); names must be unique"
                )
            seen[name] = i
        ids: dict[int, int] = {}
        for i, cid in enumerate(self.ids):
            if isinstance(cid, bool) or not isinstance(cid, int):
                raise InputError(f"category {self.names[i]!r}: id {cid!r} is not an integer")
            if cid in ids:
                raise InputError(
                    f"category id {cid} is given to both {self.names[ids[cid]]!r} and "
                    f"{self.names[i]!r}; ids must be unique"
                )
            ids[cid] = i
        for i, (kps, pairs) in enumerate(zip(self.keypoints, self.flip_map)):
            if len(set(kps)) != len(kps) or not all(isinstance(k, str) and k for k in kps):
                raise InputError(
                    f"category {self.names[i]!r}: keypoint names must be unique non-empty text"
                )
            for pair in pairs:
                if len(pair) != 2 or not all(
                    isinstance(p, int) and 0 <= p < len(kps) for p in pair
                ):
                    raise InputError(
                        f"category {self.names[i]!r}: flip_map pair {pair!r} is not two keypoint "
                        f"indices in 0..{len(kps) - 1}"
                    )

    @classmethod
    def build(
        cls,
        names: Sequence[str],
        ids: Sequence[int] | None = None,
        keypoints: Sequence[Sequence[str]] | None = None,
        flip_map: Sequence[Sequence[Sequence[int]]] | None = None,
    ) -> CategoryMap:
        """A map from plain lists; ``ids`` default to the indices, ``flip_map`` to the
        left/right pairs of the keypoint names (:func:`derive_flip_map`)."""
        kps = tuple(tuple(k) for k in keypoints) if keypoints is not None else ((),) * len(names)
        if flip_map is None:
            flips = tuple(derive_flip_map(k) for k in kps)
        else:
            flips = tuple(tuple((int(a), int(b)) for a, b in f) for f in flip_map)
        return cls(
            names=tuple(names),
            ids=tuple(range(len(names))) if ids is None else tuple(ids),
            keypoints=kps,
            flip_map=flips,
        )

    def __len__(self) -> int:
        return len(self.names)

    @property
    def index_of_id(self) -> dict[int, int]:
        return {cid: i for i, cid in enumerate(self.ids)}

    @property
    def index_of_name(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}

    @property
    def num_keypoints(self) -> int:
        """K, the most keypoints any category has (0 for none)."""
        return max((len(k) for k in self.keypoints), default=0)

    def flip_maps(self) -> dict[int, list[tuple[int, int]]]:
        """``{index: [(left, right), ...]}`` for the categories with pairs: the
        per-category ``flip_map`` of :class:`packer.augment.dense.RandomHorizontalFlip`."""
        return {i: list(p) for i, p in enumerate(self.flip_map) if p}

    def to_json(self) -> dict[str, Any]:
        cats = []
        for i, name in enumerate(self.names):
            cat: dict[str, Any] = {"name": name, "id": self.ids[i]}
            if self.keypoints[i]:
                cat["keypoints"] = list(self.keypoints[i])
                cat["flip_map"] = [list(p) for p in self.flip_map[i]]
            cats.append(cat)
        return {"format": CATEGORY_MAP_FORMAT, "version": CATEGORY_MAP_VERSION, "categories": cats}

    @classmethod
    def from_json(cls, obj: object, where: str = "a category map") -> CategoryMap:
        """The map :meth:`to_json` wrote; anything else is an :class:`InputError` naming ``where``."""
        if not isinstance(obj, dict) or obj.get("format") != CATEGORY_MAP_FORMAT:
            raise InputError(
                f'{where}: not an imgpack category map (no "format": {CATEGORY_MAP_FORMAT!r})'
            )
        if obj.get("version") != CATEGORY_MAP_VERSION:
            raise InputError(
                f"{where}: category map version {obj.get('version')!r}; this imgpack reads "
                f"version {CATEGORY_MAP_VERSION}"
            )
        cats = obj.get("categories")
        if not isinstance(cats, list) or not cats:
            raise InputError(f'{where}: "categories" must be a non-empty list')
        names, ids, kps, flips = [], [], [], []
        for i, cat in enumerate(cats):
            if not isinstance(cat, dict) or not isinstance(cat.get("name"), str):
                raise InputError(f'{where}: category {i} must be an object with a "name"')
            names.append(cat["name"])
            ids.append(cat.get("id", i))
            k = cat.get("keypoints", [])
            f = cat.get("flip_map", [])
            if (
                not isinstance(k, list)
                or not isinstance(f, list)
                or not all(isinstance(p, list) and len(p) == 2 for p in f)
            ):
                raise InputError(
                    f"{where}: category {cat['name']!r}: keypoints and flip_map must be lists"
                )
            kps.append(tuple(k))
            flips.append(tuple(tuple(p) for p in f))
        try:
            return cls(tuple(names), tuple(ids), tuple(kps), tuple(flips))
        except InputError as e:
            raise InputError(f"{where}: {e}") from None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the map as JSON to ``path``, whole or not at all."""
        data = json.dumps(self.to_json(), indent=1, ensure_ascii=False).encode()
        write_atomic(path, data + b"\n")


def load_category_map(
    path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_FILE_BYTES
) -> CategoryMap:
    """A user's category map: the JSON :meth:`CategoryMap.save` writes, or a text file of
    names, one a line (:func:`packer.sources.classes.read_class_file`; ids are the
    indices). Read only if it is a regular file of at most ``max_bytes``."""
    p = Path(path)
    if p.suffix.lower() == ".json":
        data = read_regular(p, max_bytes, "a category map")
        try:
            obj = loads_json(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise InputError(
                f"{p}: not valid JSON ({e}); give a category map CategoryMap.save wrote"
            ) from None
        return CategoryMap.from_json(obj, str(p))
    from ..classes import read_class_file

    return CategoryMap.build(read_class_file(p))


def resolve_categories(
    found: CategoryMap,
    fixed: CategoryMap | None,
    allow_new: bool = False,
    *,
    source: str = "the source",
) -> CategoryMap:
    """The map a build uses: ``found`` (the source's declared categories) when there is
    no ``fixed`` map; else ``fixed``, with categories of ``found`` it lacks appended in
    ``found``'s order when ``allow_new`` (refused otherwise, naming them). Categories are
    matched by name; a category of ``fixed`` without keypoint names takes ``found``'s,
    and two different keypoint lists for one category are refused."""
    if fixed is None:
        return found
    index = fixed.index_of_name
    new = [i for i, n in enumerate(found.names) if n not in index]
    if new and not allow_new:
        names = ", ".join(repr(found.names[i]) for i in new)
        raise InputError(
            f"categor{'ies' if len(new) > 1 else 'y'} {names} of {source} not in the category "
            "map; set AnnotationConfig.allow_new_categories to append them at the end, or fix "
            "the map",
            field="AnnotationConfig.allow_new_categories",
        )
    kps = list(fixed.keypoints)
    flips = list(fixed.flip_map)
    for i, name in enumerate(found.names):
        j = index.get(name)
        if j is None or not found.keypoints[i]:
            continue
        if not kps[j]:
            kps[j], flips[j] = found.keypoints[i], found.flip_map[i]
        elif kps[j] != found.keypoints[i]:
            raise InputError(
                f"category {name!r}: {source} names its keypoints {list(found.keypoints[i])}, "
                f"the category map {list(kps[j])}; the order of keypoints must match"
            )
    used = set(fixed.ids)
    ids = list(fixed.ids)
    next_id = max(used, default=-1) + 1
    for i in new:
        cid = found.ids[i]
        if cid in used:  # the source's id is taken in the map: a fresh one
            cid, next_id = next_id, next_id + 1
        used.add(cid)
        ids.append(cid)
    return CategoryMap(
        names=fixed.names + tuple(found.names[i] for i in new),
        ids=tuple(ids),
        keypoints=tuple(kps) + tuple(found.keypoints[i] for i in new),
        flip_map=tuple(flips) + tuple(found.flip_map[i] for i in new),
    )
