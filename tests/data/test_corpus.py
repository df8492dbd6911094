import json

import pytest

from burnout.config import DataConfig, SourceConfig
from burnout.data.corpus import iter_documents, mix_documents
from burnout.errors import BurnoutError

SMALL = 200_000


def test_default_corpus_mixes_both_stdlib_sources_at_their_weights():
    train, val, report = mix_documents(DataConfig(max_chars=SMALL))
    shares = {name: entry["share"] for name, entry in report["per_source"].items()}
    assert shares == pytest.approx({"docs": 0.7, "code": 0.3}, abs=0.03)
    assert report["total"]["chars"] == pytest.approx(SMALL, rel=0.01)
    assert sum(map(len, train)) + sum(map(len, val)) == report["total"]["chars"]
    assert any("def " in doc for doc in train + val)  # code made it in
    for entry in report["per_source"].values():
        assert entry["train_documents"] >= 1 and entry["val_documents"] >= 1


def test_mix_is_deterministic_and_seeded():
    first = mix_documents(DataConfig(max_chars=SMALL))
    assert mix_documents(DataConfig(max_chars=SMALL)) == first
    other = mix_documents(DataConfig(max_chars=SMALL, seed=7))
    assert other[0] != first[0]


def test_val_and_train_are_disjoint_documents(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    for i in range(40):
        (folder / f"{i:02d}.txt").write_text(f"document number {i}\n" * 5, encoding="utf-8")
    cfg = DataConfig(sources=[SourceConfig(name="t", kind="text", path=str(folder))], max_chars=10**6, val_fraction=0.1)
    train, val, report = mix_documents(cfg)
    assert len(val) == 4 and len(train) == 36
    assert not set(train) & set(val)
    assert sorted(train + val) == sorted(iter_documents(cfg.sources[0]))
    assert report["per_source"]["t"]["shortfall_chars"] > 0


def test_budget_cuts_the_last_document(tmp_path):
    (tmp_path / "a.txt").write_text("x" * 1000, encoding="utf-8")
    (tmp_path / "b.txt").write_text("y" * 1000, encoding="utf-8")
    cfg = DataConfig(sources=[SourceConfig(name="t", kind="text", path=str(tmp_path / "*.txt"))], max_chars=1500)
    train, val, report = mix_documents(cfg)
    assert sorted(map(len, train + val)) == [500, 1000]
    assert report["per_source"]["t"]["chars"] == 1500


def test_zero_weight_source_is_skipped():
    cfg = DataConfig(
        sources=[
            SourceConfig(name="docs", kind="stdlib_docs", weight=1.0),
            SourceConfig(name="code", kind="stdlib_code", weight=0.0),
        ],
        max_chars=50_000,
    )
    _, _, report = mix_documents(cfg)
    assert list(report["per_source"]) == ["docs"]


def test_jsonl_source_reads_the_text_field(tmp_path):
    path = tmp_path / "d.jsonl"
    lines = [json.dumps({"body": f"line {i} ünïcode"}) for i in range(10)]
    path.write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    source = SourceConfig(name="j", kind="jsonl", path=str(path), text_field="body")
    assert list(iter_documents(source)) == [f"line {i} ünïcode" for i in range(10)]


def test_jsonl_missing_field_names_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "ok"}\n{"other": 1}\n', encoding="utf-8")
    with pytest.raises(BurnoutError, match=r"d\.jsonl:2.*no field 'text'"):
        list(iter_documents(SourceConfig(name="j", kind="jsonl", path=str(path))))


def _text_cfg(path) -> DataConfig:
    return DataConfig(sources=[SourceConfig(name="mine", kind="text", path=str(path))], max_chars=10_000)


def test_missing_path_is_a_burnout_error(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(BurnoutError, match="'mine'.*nope.txt.*does not exist"):
        mix_documents(_text_cfg(missing))


def test_empty_file_is_a_burnout_error(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(BurnoutError, match="'mine'.*empty.txt.*no text"):
        mix_documents(_text_cfg(empty))


def test_binary_file_is_a_burnout_error(tmp_path):
    binary = tmp_path / "blob.txt"
    binary.write_bytes(b"hello\x00\x01\x02world")
    with pytest.raises(BurnoutError, match="blob.txt.*binary"):
        mix_documents(_text_cfg(binary))


def test_non_utf8_file_is_a_burnout_error(tmp_path):
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("café crème".encode("latin-1"))
    with pytest.raises(BurnoutError, match="latin1.txt.*not UTF-8"):
        mix_documents(_text_cfg(latin))


def test_errors_are_one_line(tmp_path):
    with pytest.raises(BurnoutError) as info:
        mix_documents(_text_cfg(tmp_path / "nope.txt"))
    assert "\n" not in str(info.value)
