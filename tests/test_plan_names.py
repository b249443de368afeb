"""A plan's names reach generated scripts and the terminal: control characters are refused where
the file is read (issue 25), so a tampered or oddly made plan cannot smuggle a line into them."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from opweave_planner.contract import read_plan
from opweave_planner.errors import UserError

GOLDEN = Path(__file__).parent / "golden" / "llama-3.1-8b_afd_h100+a100_v1.2.json"


@pytest.mark.parametrize("where", ["model", "model_source", "owners.0.gpu", "search.space.gpus.0"])
@pytest.mark.parametrize("bad", ["x\ntouch /tmp/pwned", "x\r\n", "\x1b[31mred", "a\x00b", "\x85", ""])
def test_control_characters_in_names_are_refused(tmp_path, where, bad):
    doc = orjson.loads(GOLDEN.read_bytes())
    node, *path = where.split(".")
    if path:
        target = doc[node]
        for key in path[:-1]:
            target = target[int(key)] if key.isdigit() else target[key]
        last = path[-1]
        target[int(last) if last.isdigit() else last] = bad
    else:
        doc[node] = bad
    bad_file = tmp_path / "plan.json"
    bad_file.write_bytes(orjson.dumps(doc))
    with pytest.raises(UserError) as info:
        read_plan(bad_file)
    text = str(info.value)
    assert "\n" not in text and str(bad_file) in text
    assert where.split(".")[0] in text
