"""The embedded default model: a tiny Llama and its tokenizer, built offline from a fixed seed.

Nothing is downloaded: the tokenizer is a byte-level BPE trained by the `tokenizers` library on a corpus
generated here from a seeded word list, and the weights are random (seeded) bf16. The same inputs give the
same bytes on every build, so a model directory is identified by a digest of its recipe; it is built once
and cached outside the repository (`$SGLANG_EXT_HOME`, default `~/.cache/sglang_ext`).

The model is useless as a language model and exists to exercise the serving path: real tokenization, a real
Llama forward pass on CPU, real KV cache pages (2 layers x 2 KV heads x 32 dims, 256 bytes per token in bf16).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path

RECIPE = {
    "name": "tiny-llama",
    "version": 1,
    "seed": 20261129,
    "vocab_size": 2048,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 8192,
    "corpus_sentences": 40000,
}

SPECIAL_TOKENS = ["<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' }}{{ message['content'] if message['content'] is string else "
    "message['content'] | map(attribute='text') | join('') }}{{ '<|end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

_SYLLABLES = (
    "ka ri to na mo le su vi pa de lo an er in on ul ex tra pre con ism ing ly ed al ous ment tion "
    "sta bri clo dra fle gru pho que spe thi wor yan zel kor mir nas pol rev sil tum vak"
).split()
_WORDS = (
    "the a an of to in and or is are was be for on with as by at from this that it not but can will "
    "cache token prefix session tenant model server request reply host device peer memory block page "
    "tree node hit miss evict admit window sketch time first turn chat user assistant system prompt "
    "what how why when where who which please tell me about explain summary answer question long short "
    "one two three four five six seven eight nine ten hundred thousand data file code test run fast slow"
).split()


def model_home() -> Path:
    return Path(os.environ.get("SGLANG_EXT_HOME", Path.home() / ".cache" / "sglang_ext"))


def recipe_digest() -> str:
    return hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:12]


def model_dir() -> Path:
    return model_home() / "models" / f"{RECIPE['name']}-v{RECIPE['version']}-{recipe_digest()}"


def ensure_embedded_model() -> Path:
    """Return the embedded model's directory, building it first if it is not there yet."""
    target = model_dir()
    if (target / "DONE").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build in a private directory, then rename: concurrent first uses never see a half-written model.
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        _build(staging)
        (staging / "DONE").write_text(recipe_digest() + "\n")
        try:
            staging.rename(target)
        except OSError:
            if not (target / "DONE").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _corpus(rng: random.Random):
    invented = sorted({"".join(rng.choices(_SYLLABLES, k=rng.randint(1, 4))) for _ in range(3000)})
    vocabulary = _WORDS + invented
    weights = [1.0 / (rank + 1) for rank in range(len(vocabulary))]  # Zipf-like, as real text
    for _ in range(RECIPE["corpus_sentences"]):
        words = rng.choices(vocabulary, weights=weights, k=rng.randint(4, 16))
        number = str(rng.randint(0, 9999)) if rng.random() < 0.2 else ""
        yield " ".join(words).capitalize() + (f" {number}" if number else "") + rng.choice([".", "?", "!", ","])


def _build(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    rng = random.Random(RECIPE["seed"])
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=RECIPE["vocab_size"],
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(rng), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=RECIPE["hidden_size"],
        intermediate_size=RECIPE["intermediate_size"],
        num_hidden_layers=RECIPE["num_hidden_layers"],
        num_attention_heads=RECIPE["num_attention_heads"],
        num_key_value_heads=RECIPE["num_key_value_heads"],
        max_position_embeddings=RECIPE["max_position_embeddings"],
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.convert_tokens_to_ids("<|end|>"),
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(RECIPE["seed"])
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    # Drop the generation-config timestamped fields: the directory must hash the same on every build.
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": config.bos_token_id,
                                                             "eos_token_id": config.eos_token_id}, indent=2))


def main() -> None:
    print(ensure_embedded_model())


if __name__ == "__main__":
    main()
