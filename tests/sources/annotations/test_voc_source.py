"""Pascal VOC XML: 1-based boxes to pixels, difficult kept, entity declarations refused."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.dense_data import NAMES, make_truth, write_voc
from packer.sources.annotations import AnnotationConfig, read_annotations
from packer.sources.annotations.voc import UnsafeXML, parse_xml, read_voc

BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<annotation><filename>img_000.png</filename><object><name>&lol9;</name></object></annotation>
"""


def test_boxes_difficult_and_categories(tmp_path):
    truths = make_truth(3)
    write_voc(tmp_path, truths, difficult={1: 1})
    ann = read_annotations(tmp_path)
    assert ann.format == "voc" and ann.root == tmp_path / "JPEGImages"
    assert ann.categories.names == tuple(sorted(NAMES))
    idx = ann.categories.index_of_name
    assert ann.skipped == []
    for got, t in zip(ann.images, truths):
        assert got.size == t.size and got.image_id == t.stem
        np.testing.assert_array_equal(got.boxes, np.array([s.box for s in t.shapes], np.float32))
        assert got.labels.tolist() == [idx[s.name] for s in t.shapes]
        assert got.difficult.dtype == np.uint8 and got.difficult.tolist() == [0, 1, 0]


def test_a_split_listing_selects_images(tmp_path):
    truths = make_truth(3)
    write_voc(tmp_path, truths)
    (tmp_path / "ImageSets" / "Main" / "val.txt").write_text("img_001\n")
    ann = read_voc(tmp_path, AnnotationConfig(split="val"))
    assert [im.file for im in ann.images] == ["img_001.png"]


def test_billion_laughs_is_refused_before_expansion(tmp_path):
    with pytest.raises(UnsafeXML, match="declares a DOCTYPE"):
        parse_xml(BILLION_LAUGHS)
    truths = make_truth(2)
    write_voc(tmp_path, truths)
    (tmp_path / "Annotations" / "img_000.xml").write_bytes(BILLION_LAUGHS)
    ann = read_voc(tmp_path)
    assert [im.file for im in ann.images] == ["img_001.png"]
    [skip] = ann.skipped
    assert skip.file == "img_000.xml" and "declares a DOCTYPE" in skip.reason


@pytest.mark.parametrize(
    "doc",
    [
        b'<!DOCTYPE a SYSTEM "file:///etc/passwd"><annotation>&x;</annotation>',
        b'<?xml version="1.0"?><!DOCTYPE a [<!ENTITY x SYSTEM "file:///etc/passwd">]><a>&x;</a>',
        '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE a [<!ENTITY x "y">]><a>&x;</a>'.encode(
            "utf-16"
        ),
    ],
)
def test_external_and_encoded_declarations_are_refused(doc):
    with pytest.raises(UnsafeXML, match="declares"):
        parse_xml(doc)


def test_malformed_xml_is_a_value_error():
    with pytest.raises(ValueError, match="not well-formed"):
        parse_xml(b"<annotation><object></annotation>")
