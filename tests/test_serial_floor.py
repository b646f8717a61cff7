"""The data node's own schedule solved exactly (``serial_floor.serial_trip_floor``)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skippipe.bounds import trip_floor
from skippipe.costs import BACKWARD_FACTOR, INJECT_GAP_S, LOSS_FACTOR, OP_GAP_S
from skippipe.serial_floor import serial_trip_floor

FACTORS = (LOSS_FACTOR, BACKWARD_FACTOR, INJECT_GAP_S, OP_GAP_S)


def brute_force(forward: float, out_lag: float, back_lag: float, m: int, slots: int) -> float:
    """Every order of every microbatch's operations (no first in, first out), each started as
    early as it can: the least finish."""
    loss, bwd = LOSS_FACTOR * forward, BACKWARD_FACTOR * forward
    dur = (forward, loss, bwd)
    gap = (INJECT_GAP_S, OP_GAP_S, OP_GAP_S)
    k = min(slots, m)
    best = math.inf

    def search(done: tuple[int, ...], ready: tuple[float, ...], free: float, finish: float) -> None:
        nonlocal best
        if all(d == 3 for d in done):
            best = min(best, finish)
            return
        in_flight = sum(1 for d in done if d in (1, 2))
        for i, d in enumerate(done):
            if d == 3 or (d == 0 and in_flight >= k):
                continue
            start = max(free, ready[i])
            end = start + dur[d]
            lag = (out_lag, back_lag, 0.0)[d]
            search(done[:i] + (d + 1,) + done[i + 1:], ready[:i] + (end + lag,) + ready[i + 1:],
                   end + gap[d], max(finish, end) if d == 2 else finish)

    search((0,) * m, (0.0,) * m, 0.0, 0.0)
    return best


lags = st.floats(0.0, 12.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(st.floats(0.2, 4.0), lags, lags, st.integers(1, 3), st.integers(1, 3))
def test_serial_floor_is_the_least_finish_of_every_order(forward, out_lag, back_lag, m, slots):
    value = serial_trip_floor(forward, out_lag, back_lag, m, slots, *FACTORS)
    assert value == pytest.approx(brute_force(forward, out_lag, back_lag, m, slots), abs=1e-9)


def test_serial_floor_matches_every_order_with_four_microbatches():
    for forward, out_lag, back_lag, slots in [(2.64, 3.0, 4.0, 2), (1.0, 0.5, 9.0, 3), (3.0, 7.0, 1.0, 2)]:
        value = serial_trip_floor(forward, out_lag, back_lag, 4, slots, *FACTORS)
        assert value == pytest.approx(brute_force(forward, out_lag, back_lag, 4, slots), abs=1e-9)


@settings(max_examples=80, deadline=None)
@given(st.floats(0.2, 4.0), st.floats(0.0, 30.0), st.floats(0.0, 30.0), st.integers(1, 6), st.integers(1, 4))
def test_serial_floor_is_never_below_the_closed_form(forward, out_lag, back_lag, m, slots):
    value = serial_trip_floor(forward, out_lag, back_lag, m, slots, *FACTORS)
    assert value is not None  # m <= 6 never needs the step limit
    round_trip = forward * (1 + LOSS_FACTOR + BACKWARD_FACTOR) + out_lag + back_lag
    closed = trip_floor(round_trip, forward, forward * BACKWARD_FACTOR, m, slots, INJECT_GAP_S, OP_GAP_S)
    assert value >= closed - 1e-9


def test_losses_between_short_trips_raise_the_floor():
    # trips short next to the data node's own work: its losses must fit between the backwards
    # and injections the closed form packs back to back (31.47 s); every order takes 34.30 s
    forward, out_lag, back_lag, m, slots = 2.64, 2.0, 3.0, 4, 2
    round_trip = forward * (1 + LOSS_FACTOR + BACKWARD_FACTOR) + out_lag + back_lag
    closed = trip_floor(round_trip, forward, forward * BACKWARD_FACTOR, m, slots, INJECT_GAP_S, OP_GAP_S)
    value = serial_trip_floor(forward, out_lag, back_lag, m, slots, *FACTORS)
    assert value == pytest.approx(brute_force(forward, out_lag, back_lag, m, slots), abs=1e-9)
    assert value >= closed * 1.08


def test_serial_floor_gives_up_on_long_searches():
    assert serial_trip_floor(1.0, 5.0, 7.0, 24, 4, *FACTORS) is None
    assert serial_trip_floor(1.0, math.inf, 7.0, 6, 3, *FACTORS) is None
