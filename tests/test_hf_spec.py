"""`distperf(model="hf:<config>")` as the pytest process reads it, without transformers or torch:
where the config is found (folder, file, relative to the test's folder, the local hub cache),
the errors that say what to pass or download, and the shape's sizes from an HF config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_distperf.models import ModelError, context_limit, hf_config, hf_config_path, shape_of
from pytest_distperf.options import SettingError, workload_from_marker
from pytest_distperf.perfmodel.shape import hf_sizes
from pytest_distperf.spec import RunSpec, Workload

LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 48,
}


def _config(folder: Path, **values: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**LLAMA, **values}))
    return folder


def test_hf_names_its_own_model_source_and_its_shape_comes_from_the_ranks() -> None:
    workload = Workload(model="hf:configs/llama")
    assert (workload.model_source, workload.is_custom_builder) == ("hf", True)
    assert RunSpec("t", "auto", 1, "cpu", workload, 1, 0, 10.0).model_source == "hf"
    assert shape_of("hf:configs/llama") is None  # measured on the built model
    assert Workload(model="litgpt:pythia-14m").model_source == "litgpt"
    assert Workload(model="tiny").model_source == "preset"
    assert Workload(model="pkg.mod:build").model_source == "builder"


def test_a_folder_its_file_relative_or_absolute(tmp_path: Path) -> None:
    folder = _config(tmp_path / "configs" / "llama")
    expected = folder / "config.json"
    assert hf_config_path("hf:configs/llama", str(tmp_path)) == expected
    assert hf_config_path("hf:configs/llama/config.json", str(tmp_path)) == expected
    assert hf_config_path(f"hf:{folder}", "/elsewhere") == expected
    assert context_limit("hf:configs/llama", str(tmp_path)) == 48
    assert hf_config("hf:configs/llama", str(tmp_path))["num_key_value_heads"] == 2


def test_a_hub_id_in_the_local_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "models--org--tiny-llama"
    _config(repo / "snapshots" / "abc123")
    _config(repo / "snapshots" / "old", max_position_embeddings=16)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123\n")
    found = hf_config_path("hf:org/tiny-llama", str(tmp_path / "tests"))
    assert found == repo / "snapshots" / "abc123" / "config.json"  # the snapshot main names
    assert context_limit("hf:org/tiny-llama") == 48


def test_anything_else_says_what_to_pass_or_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelError) as missing:
        hf_config_path("hf:meta-llama/Llama-3.2-1B", str(tmp_path))
    message = str(missing.value)
    assert "hf download meta-llama/Llama-3.2-1B config.json" in message
    assert str(tmp_path / "hub") in message and "pytest-distperf[hf]" in message
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="holds no config.json"):
        hf_config_path("hf:empty", str(tmp_path))
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ModelError, match="cannot read .*broken.json as a JSON config"):
        hf_config("hf:broken.json", str(tmp_path))
    (tmp_path / "other.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ModelError, match='no "model_type"'):
        hf_config("hf:other.json", str(tmp_path))


def test_the_marker_takes_hf_names_and_refuses_an_empty_one() -> None:
    workload = workload_from_marker({"model": "hf:configs/llama"}, "test_x", ("tiny",))
    assert workload.model == "hf:configs/llama"
    with pytest.raises(SettingError, match=r"'hf:<config folder, file or hub id>'"):
        workload_from_marker({"model": "hf:"}, "test_x", ("tiny",))


def test_a_missing_config_fails_the_test_at_collection(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_missing="""
        import pytest

        @pytest.mark.distperf(model="hf:no_such_folder")
        def test_it(distperf):
            distperf.run()
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--distperf-accelerator=cpu")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*hf:no_such_folder*no config at*no_such_folder*hf download*"])


def test_hf_sizes_read_the_configs_names_and_fill_in_defaults() -> None:
    sizes = hf_sizes(LLAMA)
    assert sizes == {
        "n_layer": 4,
        "n_embd": 64,
        "n_head": 4,
        "n_query_groups": 2,
        "head_size": 16,
        "vocab_size": 256,
        "padded_vocab_size": 256,
        "intermediate_size": 128,
        "block_size": 48,
    }
    neox = {"hidden_size": 96, "num_attention_heads": 6, "num_hidden_layers": 2}
    assert hf_sizes(neox)["n_query_groups"] == 6  # no key/value heads named: as many as heads
    assert hf_sizes(neox)["head_size"] == 16 and hf_sizes(neox)["intermediate_size"] == 384
    gpt2 = {"n_embd": 32, "n_head": 4, "n_layer": 2, "n_positions": 64, "head_dim": None}
    assert hf_sizes(gpt2)["block_size"] == 64 and hf_sizes(gpt2)["head_size"] == 8
