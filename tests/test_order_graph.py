"""The stage orders as one graph (``planner.routing.order_graph``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from skippipe.planner.routing.order_graph import order_graph
from skippipe.planner.stage_orders import stage_sequences


@settings(max_examples=80, deadline=None)
@given(stages=st.integers(2, 9), length=st.integers(1, 9), swaps=st.integers(0, 2), jump=st.integers(1, 5))
def test_the_graph_spells_exactly_the_valid_orders(stages, length, swaps, jump):
    seqs = stage_sequences(stages, min(length, stages), swaps, jump)
    if not seqs:
        return
    graph = order_graph(seqs)
    assert graph.orders() == tuple(sorted(seqs))
    # every path from the start has the same length, so a state's depth is its distance from it
    for q, _, nxt in graph.steps:
        assert graph.depth[nxt] == graph.depth[q] + 1
    assert graph.depth[graph.final] == len(seqs[0])
    assert graph.depth[0] == 0


def test_shared_beginnings_and_endings_are_merged():
    seqs = stage_sequences(9, 5, 2, 5)  # the module text's example
    graph = order_graph(seqs)
    assert (len(seqs), graph.states, len(graph.steps)) == (185, 27, 96)
    # two orders that differ only in their first stage end in the same states
    assert order_graph(((1, 3), (2, 3))).states == 3


def test_one_empty_order():
    graph = order_graph(((),))
    assert graph.steps == () and graph.final == 0 and graph.orders() == ((),)
