"""The embedded model is built offline and deterministically (same bytes every time)."""

import hashlib

from sglang_ext import embedded_model


def digest_dir(path):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir()) if p.is_file()}


def test_two_builds_give_identical_bytes_and_a_usable_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_EXT_HOME", str(tmp_path / "a"))
    first = embedded_model.ensure_embedded_model()
    monkeypatch.setenv("SGLANG_EXT_HOME", str(tmp_path / "b"))
    second = embedded_model.ensure_embedded_model()
    assert first != second
    assert digest_dir(first) == digest_dir(second)

    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(first)
    config = AutoConfig.from_pretrained(first)
    assert len(tok) >= 1000 and config.vocab_size == len(tok)
    assert config.architectures == ["LlamaForCausalLM"]
    text = "The cache keeps the prefix of every session."
    assert tok.decode(tok(text)["input_ids"]) == text
