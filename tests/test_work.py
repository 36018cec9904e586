"""The counted work: its JSON form, the busiest rank, the comparison's rules and words, the cell."""

from __future__ import annotations

import copy
import json

import pytest

from pytest_distperf.work import (
    CollectiveCount,
    PhaseWork,
    Work,
    busiest,
    compare_work,
    format_bytes,
    work_cell,
)

C = CollectiveCount


def phase(
    collectives: dict[str, CollectiveCount] | None = None,
    ops: float = 1200,
    flops: float = 1.4e10,
    kernels: float | None = 300,
) -> PhaseWork:
    if collectives is None:
        collectives = {"all_gather": C(16, 5.3e9)}
    return PhaseWork(collectives, ops, flops, kernels)


def work(decode: PhaseWork | None = None, prefill: PhaseWork | None = None, **kw: int) -> Work:
    return Work(decode or phase(), prefill or phase(flops=1.4e11), **kw)


# --- JSON ---------------------------------------------------------------------------------------


def test_json_round_trip_through_text() -> None:
    w = work(
        phase({"all_gather": C(16, 5.3e9), "all_reduce": C(0.5, 64)}, kernels=None),
        graph_breaks=2,
        recompiles=0,
    )
    text = json.dumps(w.to_json())
    assert Work.from_json(json.loads(text), "w") == w


def test_json_writes_ints_where_whole() -> None:
    data = work(phase({"all_reduce": C(12.0, 768.0)}, ops=10.0, flops=2.5)).to_json()
    assert data["decode"]["collectives"]["all_reduce"] == {"calls": 12, "bytes": 768}
    assert isinstance(data["decode"]["ops"], int)
    assert data["decode"]["flops"] == 2.5
    assert data["graph_breaks"] is None and data["recompiles"] is None


def test_equal_work_compares_and_hashes_equal() -> None:
    a = work(phase({"all_reduce": C(1, 2), "all_gather": C(3, 4)}))
    b = work(phase({"all_gather": C(3, 4), "all_reduce": C(1, 2)}))
    assert a == b and hash(a) == hash(b)
    assert list(a.decode.collectives) == ["all_gather", "all_reduce"]


def _broken(path: list[str], value: object) -> dict:
    data = copy.deepcopy(work().to_json())
    node = data
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        (["decode"], KeyError, "baseline 'x'.work: missing field 'decode'"),
        (["decode"], [], "baseline 'x'.work: field 'decode' must be a JSON object"),
        (["prefill", "ops"], "many", "work.prefill: field 'ops' must be a number, got 'many'"),
        (["decode", "flops"], -1, "work.decode: field 'flops' must be a finite number >= 0"),
        (["decode", "flops"], True, "work.decode: field 'flops' must be a number, got True"),
        (["decode", "kernels"], "x", "work.decode: field 'kernels' must be a number or null"),
        (["decode", "collectives"], None, "work.decode: field 'collectives' must be"),
        (
            ["decode", "collectives", "all_gather", "calls"],
            "16",
            "work.decode.collectives.all_gather: field 'calls' must be a number",
        ),
        (
            ["decode", "collectives", "all_gather", "bytes"],
            KeyError,
            "work.decode.collectives.all_gather: missing field 'bytes'",
        ),
        (["decode", "colectives"], {}, "work.decode: unknown field(s) ['colectives']"),
        (["graph_breaks"], 1.5, "work: field 'graph_breaks' must be an integer, got 1.5"),
        (["recompiles"], -2, "work: field 'recompiles' must be an integer >= 0, got -2"),
    ],
)
def test_bad_json_names_the_field_and_where(path: list[str], value: object, words: str) -> None:
    with pytest.raises(ValueError) as info:
        Work.from_json(_broken(path, value), "baseline 'x'.work")
    assert words in str(info.value)


def test_bad_json_that_is_not_an_object() -> None:
    with pytest.raises(ValueError, match="here: expected a JSON object, got list"):
        Work.from_json([], "here")


# --- busiest ------------------------------------------------------------------------------------


def test_busiest_takes_each_counter_from_the_rank_that_did_most() -> None:
    a = work(
        phase({"all_gather": C(16, 100)}, ops=10, flops=5, kernels=None),
        graph_breaks=None,
    )
    b = work(
        phase({"all_gather": C(8, 200), "send": C(1, 4)}, ops=7, flops=9, kernels=3),
        graph_breaks=1,
    )
    w = busiest([a, b])
    assert w.decode.collectives == {"all_gather": C(16, 200), "send": C(1, 4)}
    assert (w.decode.ops, w.decode.flops, w.decode.kernels) == (10, 9, 3)
    assert w.graph_breaks == 1 and w.recompiles is None
    assert busiest([a]) == a


def test_busiest_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one rank"):
        busiest([])


# --- compare_work -------------------------------------------------------------------------------


def test_identical_work_is_equal() -> None:
    comparison = compare_work(work(), work(), 0.0)
    assert not comparison.changes and comparison.message() == ""
    assert comparison.more == () and comparison.less == ()


def test_new_collective_kind_fails_with_the_issue_words() -> None:
    current = work(phase({"all_gather": C(16, 5.3e9), "all_reduce": C(12, 768)}))
    comparison = compare_work(work(), current, 0.5)
    assert comparison.more == ("all_reduce per token: 0 -> 12 calls (+768 B)",)


def test_a_changed_call_count_fails_even_with_the_same_bytes() -> None:
    current = work(phase({"all_gather": C(32, 5.3e9)}))
    comparison = compare_work(work(), current, 0.5)
    assert comparison.message() == "all_gather per token: 16 -> 32 calls (+0 B)"
    assert comparison.more


def test_fewer_calls_are_less_work() -> None:
    current = work(phase({"all_gather": C(8, 5.3e9)}))
    comparison = compare_work(work(), current, 0.01)
    assert comparison.more == ()
    assert comparison.less == ("all_gather per token: 16 -> 8 calls (+0 B)",)


def test_a_vanished_kind_is_less_work() -> None:
    baseline = work(phase({"all_gather": C(16, 5.3e9), "all_reduce": C(12, 768)}))
    comparison = compare_work(baseline, work(), 0.01)
    assert comparison.message() == "all_reduce per token: 12 -> 0 calls (-768 B)"
    assert comparison.less and not comparison.more


def test_fewer_calls_moving_more_bytes_is_more_work() -> None:
    current = work(phase({"all_gather": C(8, 6e9)}))
    assert compare_work(work(), current, 0.01).more


def test_bytes_beyond_tolerance_fail_with_the_issue_words() -> None:
    current = work(phase({"all_gather": C(16, 5.9e9)}))
    comparison = compare_work(work(), current, 0.01)
    assert comparison.message() == "all_gather bytes per token: 5.3 GB -> 5.9 GB (+11%)"
    assert comparison.more
    assert not compare_work(work(), current, 0.2).changes


def test_bytes_within_tolerance_are_equal() -> None:
    current = work(phase({"all_gather": C(16, 5.3e9 * 1.009)}))
    assert not compare_work(work(), current, 0.01).changes
    assert compare_work(work(), current, 0.0).changes


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("ops", 1500, "ops per token: 1200 -> 1500 (+25%)"),
        ("flops", 2.1e10, "FLOPs per token: 14 GFLOP -> 21 GFLOP (+50%)"),
        ("kernels", 420, "kernels per token: 300 -> 420 (+40%)"),
    ],
)
def test_ops_flops_and_kernels_beyond_tolerance_fail(
    field: str, value: float, message: str
) -> None:
    current = work(phase(**{field: value}))
    comparison = compare_work(work(), current, 0.01)
    assert comparison.message() == message
    assert comparison.more == (message,)
    assert not compare_work(work(), work(phase(**{field: value})), 0.99).changes


def test_less_ops_is_an_improvement() -> None:
    comparison = compare_work(work(), work(phase(ops=900)), 0.01)
    assert comparison.message() == "ops per token: 1200 -> 900 (-25%)"
    assert comparison.less and not comparison.more


def test_prefill_changes_read_per_prefill() -> None:
    current = work(prefill=phase({"all_gather": C(16, 5.3e9), "broadcast": C(1, 8)}))
    comparison = compare_work(work(), current, 0.01)
    assert "broadcast per prefill: 0 -> 1 calls (+8 B)" in comparison.more
    assert all("per prefill" in change for change in comparison.changes)


def test_kernels_unknown_on_either_side_are_not_compared() -> None:
    assert not compare_work(work(phase(kernels=None)), work(phase(kernels=900)), 0.01).changes
    assert not compare_work(work(phase(kernels=300)), work(phase(kernels=None)), 0.01).changes


def test_graph_breaks_and_recompiles_are_exact() -> None:
    comparison = compare_work(work(graph_breaks=0), work(graph_breaks=2, recompiles=5), 0.5)
    assert comparison.message() == "graph breaks: 0 -> 2"
    assert comparison.more
    fewer = compare_work(work(recompiles=3), work(recompiles=1), 0.5)
    assert fewer.message() == "recompiles: 3 -> 1" and fewer.less


def test_more_work_is_listed_before_less() -> None:
    current = work(phase(ops=900, kernels=400))
    comparison = compare_work(work(), current, 0.01)
    assert comparison.message() == (
        "kernels per token: 300 -> 400 (+33%); ops per token: 1200 -> 900 (-25%)"
    )


@pytest.mark.parametrize("tolerance", [-0.1, 1.0, 2])
def test_tolerance_out_of_range_is_an_error(tolerance: float) -> None:
    with pytest.raises(ValueError, match="work tolerance must be in"):
        compare_work(work(), work(), tolerance)


def test_fractional_counts_per_token_print_without_an_exponent() -> None:
    current = work(phase({"all_gather": C(16, 5.3e9), "barrier": C(1 / 7, 0)}, ops=1500.25))
    assert compare_work(work(), current, 0.01).message() == (
        "barrier per token: 0 -> 0.143 calls (+0 B); ops per token: 1200 -> 1500 (+25%)"
    )
    assert work_cell(work(phase({"send": C(12.5, 64.5)}))) == "S 12.5x 64.5B"


# --- the table cell and bytes -------------------------------------------------------------------


def test_work_cell() -> None:
    assert work_cell(work()) == "AG 16x 5.3GB"
    both = work(phase({"reduce_scatter": C(2, 1e6), "all_gather": C(16, 5.3e9)}))
    assert work_cell(both) == "AG 16x 5.3GB, RS 2x 1MB"
    assert work_cell(work(phase({"barrier": C(1, 0), "all_to_all": C(4, 64)}))) == (
        "A2A 4x 64B, barrier 1x"
    )
    assert work_cell(work(phase({}))) == "-"
    assert work_cell(work(phase({"all_reduce": C(0, 0)}))) == "-"
    assert work_cell(None) == "-"


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (768, "768 B"), (64.5, "64.5 B"), (1500, "1.5 kB"), (5.3e9, "5.3 GB")],
)
def test_format_bytes(n: float, text: str) -> None:
    assert format_bytes(n) == text


def test_work_pickles_as_a_rank_result_travels() -> None:
    import pickle

    w = work(phase({"all_gather": C(16, 5.3e9), "send": C(1, 8)}), graph_breaks=1)
    assert pickle.loads(pickle.dumps(w)) == w
    assert w.to_dict() == w.to_json()
