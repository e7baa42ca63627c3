"""raydlc.records: a file of the wrong shape names the field, whatever the shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import Field

from raydlc import records
from raydlc.errors import CheckpointError
from raydlc.train import checkpoint


class Item(records.Record):
    size: int = Field(ge=0)


class Doc(records.Record):
    step: int
    files: dict[str, Item]
    tags: list[str] = Field(default_factory=list)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"files": {}}, "field 'step' is missing"),
        ({"step": "five", "files": {}}, "field 'step': input should be a valid integer"),
        ({"step": 1, "files": [["a", 1]]}, "field 'files': input should be a valid dictionary, got list"),
        ({"step": 1, "files": {"a.bin": {"size": -1}}}, "field 'files[\"a.bin\"].size': input should be greater than or equal to 0"),
        ({"step": 1, "files": {"x": {}}}, "field 'files.x.size' is missing"),
        ({"step": 1, "files": {}, "tags": ["a", 2]}, "field 'tags[1]': input should be a valid string"),
        ([1, 2], "field '(the document)': input should be a valid dictionary"),
    ],
)
def test_wrong_shapes_name_the_field(data: object, says: str) -> None:
    with pytest.raises(records.RecordError) as e:
        records.parse(Doc, data)
    assert str(e.value).startswith(says), str(e.value)


def test_read_json_names_the_file_for_bytes_that_are_not_json(tmp_path: Path) -> None:
    p = tmp_path / "state.json"
    p.write_bytes(b"\xff\xfe")
    with pytest.raises(records.RecordError, match="not UTF-8"):
        records.read_json(p, Doc)
    p.write_text('{"step": 1,')
    with pytest.raises(records.RecordError, match=r"not valid JSON \(.* line 1"):
        records.read_json(p, Doc)
    with pytest.raises(records.RecordError, match="cannot read"):
        records.read_json(tmp_path / "absent.json", Doc)
    p.write_text(json.dumps({"step": 3, "files": {"a": {"size": 1}}, "added_later": True}))
    assert records.read_json(p, Doc).step == 3  # unknown keys from a newer writer are kept, not refused


def test_checkpoint_manifest_of_the_wrong_shape_names_the_field(tmp_path: Path) -> None:
    """Was: "list indices must be integers or slices, not str"."""
    (tmp_path / checkpoint.MANIFEST).write_text(json.dumps({"format": 1, "step": 5, "world_size": 2, "files": [[".metadata", 1]]}))
    with pytest.raises(CheckpointError, match=r"unreadable manifest raydlc_checkpoint.json: field 'files': input should be a valid dictionary"):
        checkpoint.verify(tmp_path)
    (tmp_path / checkpoint.MANIFEST).write_text(json.dumps({"format": 2, "step": 5, "world_size": 2, "files": {}}))
    with pytest.raises(CheckpointError, match=r"field 'format': input should be 1, got 2"):
        checkpoint.verify(tmp_path)
