"""The compiled decode step on CPU ranks (inductor): same tokens as eager, compile time apart.

Compiling on a 2-core CPU takes about a minute even for the tiny model, so this is one session
behind the `slow` marker (CI runs it).
"""

from __future__ import annotations

import json

import pytest
from helpers import shared_cache, use_shared_pool

pytestmark = pytest.mark.slow


def test_compiled_decode_gives_eager_tokens_and_reports_compile_time(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, shared_pool: str
) -> None:
    pytester.makepyfile(
        """
        import json

        import pytest

        @pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
        @pytest.mark.distperf(model="tiny", max_new_tokens=5, gates=False)
        def test_x(distperf, compiled, request):
            distperf.workload = type(distperf.workload)(
                **{**distperf.workload.params(), "compile": compiled}
            )
            result = distperf.run()
            out = request.config.rootpath / f"{'compiled' if compiled else 'eager'}.json"
            out.write_text(json.dumps({"tokens": result.tokens, "how": result.ranks[0].compiled}))
        """
    )
    report = pytester.path / "report.json"
    pool = use_shared_pool(monkeypatch, shared_pool)
    args = ("--distperf-devices=2", "--distperf-repeats=2", f"--distperf-json={report}")
    result = pytester.runpytest_subprocess(*shared_cache(), *pool, *args)
    result.assert_outcomes(passed=2)
    eager = json.loads((pytester.path / "eager.json").read_text())
    compiled = json.loads((pytester.path / "compiled.json").read_text())
    assert compiled["tokens"] == eager["tokens"]
    assert eager["how"] == "" and compiled["how"].startswith("torch.compile")
    assert "and prefill" in compiled["how"]  # auto: the prompt's pass compiled too
    rows = {row["test_id"].split("[")[1]: row for row in json.loads(report.read_text())["results"]}
    assert rows["auto-2cpu-eager]"]["compile_s"] is None
    assert rows["auto-2cpu-compiled]"]["compile_s"] > 0
    assert rows["auto-2cpu-compiled]"]["cuda_graphs"] is False  # CPU: nothing replays
    # the gates are off: the compiled run is still judged against the modelled rate, reported
    compiled_row = rows["auto-2cpu-compiled]"]
    assert "of the modelled" in compiled_row["threshold_message"]
    assert compiled_row["verdict"].startswith("off")


def test_bad_compile_value_names_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distperf(model="tiny", compile="yes")
        def test_x(distperf):
            distperf.run()
        """
    )
    result = pytester.runpytest("--distperf-devices=2")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*distperf(compile='yes') must be True or False*"])


def test_the_bare_model_compiles_its_prefill_only_where_the_wrapper_does() -> None:
    import torch

    from pytest_distperf.ranks.compiled import compile_bare_step

    model = torch.nn.Linear(2, 2)  # torch.compile is lazy: nothing is traced here
    with_prefill = compile_bare_step(model, torch.device("cpu"))
    without = compile_bare_step(model, torch.device("cpu"), with_prefill=False)
    assert with_prefill.prefill is not None and "and prefill" in with_prefill.how
    assert without.prefill is None and "prefill" not in without.how
    assert without.override() is not None and not without.cuda_graphs


def test_a_pooled_rank_forgets_earlier_tests_compiled_steps() -> None:
    """Every test compiles decode_one_token for its own model: in one pooled rank the entries of
    earlier tests' shapes piled up to dynamo's recompile limit (1 x H200: the ninth test)."""
    import dataclasses
    import itertools

    import torch
    from distperf_model import PRESETS, build_model, decode_one_token, make_prompt

    from pytest_distperf.ranks.environment import forget_compiled_code

    vocab_sizes = itertools.count(96, 32)

    def one_test() -> None:  # a model of another shape, as the next test's
        vocab = next(vocab_sizes)
        config = dataclasses.replace(PRESETS["tiny"], vocab_size=vocab, padded_vocab_size=vocab)
        model = build_model(config, seed=0)
        model.setup_caches(1, 4)
        prompt = make_prompt(model.config, 1, 2, seed=0)
        step = torch.compile(decode_one_token, backend="eager", fullgraph=True, dynamic=False)
        with torch.no_grad():
            step(model, prompt[:, -1:], torch.tensor([2]))

    with torch._dynamo.config.patch(recompile_limit=2):
        forget_compiled_code()
        with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
            for _ in range(3):
                one_test()  # what the pool did before
        for _ in range(3):
            forget_compiled_code()
            one_test()
    forget_compiled_code()
