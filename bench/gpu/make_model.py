"""Write a config-only Qwen3.6-27B-shaped text model dir for SGLang --load-format dummy.
Usage: python make_model.py OUT_DIR NUM_LAYERS
Tokenizer: WordLevel, one token per whitespace-separated word "t<id>", vocab = 248320,
so a prompt of N words is exactly N tokens and every sampled id decodes."""

import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

out, nl = sys.argv[1], int(sys.argv[2])
os.makedirs(out, exist_ok=True)
V = 248320
SPECIAL = {248044: "<|endoftext|>", 248045: "<|im_start|>", 248046: "<|im_end|>"}
text_config = {
    "model_type": "qwen3_5_text",
    "architectures": ["Qwen3_5ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_output_gate": True,
    "bos_token_id": None,
    "eos_token_id": 248044,
    "pad_token_id": None,
    "full_attention_interval": 4,
    "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(nl)],
    "head_dim": 256,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "initializer_range": 0.02,
    "intermediate_size": 17408,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "linear_value_head_dim": 128,
    "mamba_ssm_dtype": "float32",
    "max_position_embeddings": 262144,
    "mlp_only_layers": [],
    "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": False,
    "num_attention_heads": 24,
    "num_hidden_layers": nl,
    "num_key_value_heads": 4,
    "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "mrope_interleaved": True,
        "mrope_section": [11, 11, 10],
        "partial_rotary_factor": 0.25,
        "rope_theta": 10000000,
        "rope_type": "default",
    },
    "tie_word_embeddings": False,
    "use_cache": True,
    "vocab_size": V,
    "torch_dtype": "bfloat16",
    "dtype": "bfloat16",
}
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
