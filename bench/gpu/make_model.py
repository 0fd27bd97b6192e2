"""Write a config-only Qwen3.6-27B-shaped text model dir for SGLang --load-format dummy.
Usage: python make_model.py OUT_DIR NUM_LAYERS
Tokenizer: WordLevel, one token per whitespace-separated word "t<id>", vocab = 248320,
so a prompt of N words is exactly N tokens and every sampled id decodes."""

import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from bench.gpu.known_target.model import Shape, config_json

out, nl = sys.argv[1], int(sys.argv[2])
os.makedirs(out, exist_ok=True)
V = 248320
SPECIAL = {248044: "<|endoftext|>", 248045: "<|im_start|>", 248046: "<|im_end|>"}
# the known-answer target's config of the same shape (one definition of the Qwen3.6-27B-shaped config)
text_config = config_json(Shape(layers=nl), eos=248044, pad=None)
with open(os.path.join(out, "config.json"), "w") as fh:
    json.dump(text_config, fh, indent=1)
with open(os.path.join(out, "generation_config.json"), "w") as fh:
    json.dump({"eos_token_id": [248046, 248044], "do_sample": False}, fh)
vocab = {f"t{i}": i for i in range(V)}
for i, s in SPECIAL.items():
    del vocab[f"t{i}"]
    vocab[s] = i
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
tok.add_special_tokens(list(SPECIAL.values()))
tok.save(os.path.join(out, "tokenizer.json"))
chat = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)
tok_cfg = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "bos_token": None,
    "model_max_length": 262144,
    "chat_template": chat,
    "clean_up_tokenization_spaces": False,
}
with open(os.path.join(out, "tokenizer_config.json"), "w") as fh:
    json.dump(tok_cfg, fh, indent=1)
print("wrote", out, nl, "layers")
