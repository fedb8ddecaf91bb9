"""--speculative-batch-schedule: parsing, validation errors, and which settings a batch size gets."""

import pytest

from eyas.config import Algorithm, SpecConfig, format_schedule, parse_schedule
from eyas.errors import EyasError

TEXT = "1:6,8,48;4:4,4,16;16:3,1,4;32:0"


def test_parse_and_format_round_trip():
    schedule = parse_schedule(TEXT)
    assert [b for b, _ in schedule] == [1, 4, 16, 32]
    assert schedule[1][1] == SpecConfig(Algorithm.EAGLE3, 4, 4, 16)
    assert not schedule[3][1].speculative
    assert format_schedule(schedule) == TEXT
    assert parse_schedule(" 1:6,8,48; 4:4,4,16 ;") == schedule[:2]
    assert parse_schedule(None) == parse_schedule("") == ()


def test_each_batch_size_gets_the_first_entry_that_covers_it():
    spec = SpecConfig(Algorithm.EAGLE3, schedule=parse_schedule(TEXT))
    picked = {rows: spec.for_batch(rows) for rows in (1, 2, 4, 5, 16, 17, 32, 100)}
    assert picked[1].num_draft_tokens == 48
    assert picked[2] == picked[4] == SpecConfig(Algorithm.EAGLE3, 4, 4, 16)
    assert picked[5] == picked[16] == SpecConfig(Algorithm.EAGLE3, 3, 1, 4)
    assert not any(picked[r].speculative for r in (17, 32, 100))  # the last entry covers larger batches
    assert spec.verify_sizes == [1, 4, 16, 48]
    plain = SpecConfig(Algorithm.EAGLE3, 5, 1, 6)
    assert plain.for_batch(64) is plain and plain.verify_sizes == [6]


@pytest.mark.parametrize("text, match", [
    ("1:6,8", "(?s)not BOUND:STEPS,TOPK,TOKENS.*fix: write BOUND"),
    ("1:6,8,48;x:0", "'x:0' is not BOUND"),
    ("4:3,1,4;1:6,8,48", "(?s)must rise strictly.*fix"),
    ("4:3,1,4;4:0", "must rise strictly"),
    ("0:3,1,4", "of 1 or more"),
    ("1:0;8:0", "(?s)never speculates.*--speculative-algorithm NONE"),
    ("1:3,1,8", "(?s)entry '1:3,1,8'.*larger than the tree can hold.*fix: lower"),
    ("1:3,0,4", "entry '1:3,0,4'.*positive integer"),
    ("1:6,8,1", "entry '1:6,8,1'.*leaves no draft token"),
])
def test_bad_schedules_say_what_is_wrong_and_how_to_fix_it(text, match):
    with pytest.raises(EyasError, match=match):
        SpecConfig(Algorithm.EAGLE3, schedule=parse_schedule(text))


def test_a_schedule_needs_speculation():
    with pytest.raises(EyasError, match="(?s)speculative-algorithm is NONE.*drop the schedule"):
        SpecConfig(Algorithm.NONE, schedule=parse_schedule("1:3,1,4"))
