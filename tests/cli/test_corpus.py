"""`gpseq corpus list | fetch`: the catalogue's names, and a fetch from a mirror checked against the
recorded sha256."""

from __future__ import annotations

import json

from helpers.cli import invoke


def test_corpus_list_json_and_table():
    result = invoke("corpus", "list", "--json")
    assert result.exit_code == 0
    names = [entry["name"] for entry in json.loads(result.stdout)]
    assert "conll2000" in names
    table = invoke("corpus", "list")
    assert "conll2000" in table.stdout


def test_corpus_fetch_from_mirror_checks_sha256(corpora_dir, tmp_path):
    import hashlib

    from gpseq.corpora import get_corpus

    result = invoke("corpus", "fetch", "crfpp-basenp", "--mirror", corpora_dir, "--dest", tmp_path)
    assert result.exit_code == 0, result.stderr
    for spec in get_corpus("crfpp-basenp")["files"].values():
        copied = tmp_path / spec["path"]
        assert copied.read_bytes() == (corpora_dir / spec["path"]).read_bytes()
        if spec["sha256"]:
            assert hashlib.sha256(copied.read_bytes()).hexdigest() == spec["sha256"]
    unknown = invoke("corpus", "fetch", "no-such-corpus", "--mirror", corpora_dir, "--dest", tmp_path)
    assert unknown.exit_code == 4 and "unknown corpus" in unknown.stderr
