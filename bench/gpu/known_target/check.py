"""Run a known-target model dir (the ``model`` step) through transformers' own Qwen3.5 code (the dense
variant: Qwen3's; CPU, torch) and report, as one JSON object on stdout, what the tests
(tests/bench/test_known_target*.py) check:

- ``missing`` / ``unexpected``: checkpoint keys transformers' Qwen3_5ForCausalLM did not find / did not know
  (the ``mtp.*`` tensors are SGLang's; transformers ignores them by design);
- ``shape_mismatch``: tensors whose shape differs from the model's parameter;
- ``logits``: for every chain state, the model's last-position logits with that token ending a real chat
  prompt (thinking on): the successors' values and the largest value over all other ids;
- ``probs``: the distribution SGLang samples from, computed from those logits (temperature, top-k, top-p);
- ``mtp_logits_equal`` (null for the dense variant: no MTP): SGLang's MTP forward emulated from the
  checkpoint tensors (embedding -> zero-centred
  RMSNorm -> fc -> decoder layer with zero outputs -> RMSNorm -> lm_head) gives the main model's logits;
- ``generated``: token ids of a few ``generate(do_sample=True, ...)`` runs (the test checks each step is a
  designed transition).

Usage: python -m bench.gpu.known_target check MODEL_DIR [--generate N] [--new-tokens T]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoTokenizer, Qwen3_5ForCausalLM, Qwen3ForCausalLM

from bench.gpu.known_target.model import Chain, sampled_probs


def gemma_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3.5's RMSNorm (zero-centred weight), as both transformers and SGLang's GemmaRMSNorm compute it."""
    y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return (y * (1.0 + w.float())).to(x.dtype)


def mtp_logits_equal(tensors: dict, states: list[int], logits: torch.Tensor, eps: float) -> bool:
    """SGLang's Qwen3_5ForCausalLMMTP forward from the checkpoint tensors equals the main model's logits."""
    emb, head, fc = tensors["model.embed_tokens.weight"], tensors["lm_head.weight"], tensors["mtp.fc.weight"]
    n_e, n_h, n_o = (
        tensors[f"mtp.{n}.weight"] for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")
    )
    t = torch.tensor(states)
    hidden = torch.randn(len(states), emb.shape[1], dtype=torch.bfloat16)  # the target's hidden: unused by fc
    x = torch.cat([gemma_norm(emb[t], n_e, eps), gemma_norm(hidden, n_h, eps)], dim=-1) @ fc.T
    return bool(torch.equal((gemma_norm(x, n_o, eps) @ head.T).float(), logits))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model", type=Path)
    p.add_argument("--generate", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=300)
    a = p.parse_args(argv)
    torch.manual_seed(0)
    chain = Chain.from_json(json.loads((a.model / "chain.json").read_text()))
    cfg = json.loads((a.model / "config.json").read_text())
    cls = {"Qwen3_5ForCausalLM": Qwen3_5ForCausalLM, "Qwen3ForCausalLM": Qwen3ForCausalLM}[
        cfg["architectures"][0]
    ]
    model, info = cls.from_pretrained(a.model, dtype=torch.bfloat16, output_loading_info=True)
    model.eval()
    tok = AutoTokenizer.from_pretrained(a.model)
    out: dict = {
        "missing": sorted(info["missing_keys"]),
        "unexpected": sorted(k for k in info["unexpected_keys"] if not k.startswith("mtp.")),
        "shape_mismatch": [str(x) for x in info.get("mismatched_keys", [])],
    }
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, enable_thinking=True)
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    out["prompt_last"] = ids[-1]
    states = sorted(chain.states)
    batch = torch.tensor([[*ids[:-1], t] for t in states])
    with torch.no_grad():
        logits = model(input_ids=batch).logits[:, -1, :].float()
    out["logits"] = {}
    out["probs"] = {}
    for row, t in zip(logits, states, strict=True):
        succ = chain.states[t].succ
        mask = torch.ones_like(row, dtype=torch.bool)
        mask[list(succ)] = False
        vals = {u: float(row[u]) for u in succ}
        out["logits"][t] = {
            "succ": vals,
            "other_max": float(row[mask].max()),
            "other_min": float(row[mask].min()),
        }
        out["probs"][t] = sampled_probs(vals, chain.sampling)
    # MTP as SGLang's Qwen3_5ForCausalLMMTP computes it, from the checkpoint tensors
    eps = cfg["rms_norm_eps"]
    tensors = {}
    for path in sorted(a.model.glob("model*.safetensors")):
        with safe_open(str(path), "pt") as f:
            tensors.update(
                zip(f.keys(), map(f.get_tensor, f.keys()), strict=True)
            )  # safe_open has no __iter__
    out["architecture"] = cls.__name__
    zero_outputs = all(
        not v.any()
        for k, v in tensors.items()
        if k.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight"))
    )
    out["mtp_logits_equal"] = (
        mtp_logits_equal(tensors, states, logits, eps) if "mtp.fc.weight" in tensors else None
    )
    out["zero_output_projections"] = zero_outputs
    gen = model.generate(
        torch.tensor([ids] * a.generate),
        do_sample=True,
        temperature=chain.sampling.temperature,
        top_k=chain.sampling.top_k,
        top_p=chain.sampling.top_p,
        max_new_tokens=a.new_tokens,
        eos_token_id=chain.eos,
        pad_token_id=chain.eos,
    )
    out["generated"] = [g[len(ids) :].tolist() for g in gen]
    json.dump(out, sys.stdout)
    return 0
