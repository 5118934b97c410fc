"""A compare too short to time any step says so before it runs, instead of leaving tokens/s n/a unexplained."""

from harness.compare.compare_cli import untimed_note


def test_a_sweep_with_no_step_past_the_warm_up_says_how_to_time_one():
    note = untimed_note(steps=2, timing_warmup=2)
    assert note is not None
    assert "steps=3" in note and "n/a" in note


def test_a_sweep_with_a_timed_step_prints_nothing():
    assert untimed_note(steps=3, timing_warmup=2) is None
    assert untimed_note(steps=1, timing_warmup=0) is None
