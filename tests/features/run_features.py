"""regen's features of a tiny random-weight target, read by the trainers' own loaders; prints JSON.

Runs in the trainers' venv (``make test-trainers``: SpecForge 0.2.0, speculators 0.9.0, transformers,
CPU torch); ``tests/features/test_trainers_read_features.py`` starts it and judges the result.

    python run_features.py WORK_DIR ARCH [LAYER_SHIFT]

ARCH is llama or qwen3. LAYER_SHIFT (default 0) adds to every auxiliary layer id before computing, so the
judge can see the reference comparison fail on features that are off by one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import orjson
import torch
from hs_connectors import FP8Transfer
from specforge.data.preprocessing import OfflineEagle3Dataset, list_local_files
from speculators.train.data import ArrowDataset, CollateFn
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

from regen.features.backends import SGLangBackend, TransformersBackend
from regen.features.compute import run_shard
from regen.features.config import LAYER_CONVENTION, RowChoice, eagle3_layers
from regen.features.export import to_specforge, to_speculators
from regen.features.rows import chosen, read_token_rows
from regen.features.store import FeatureSettings

LAYERS = 8
HIDDEN = 64
VOCAB = 256


def tiny_model(arch: str, out: Path) -> Path:
    """A random-weight target built from a config, saved as a model dir."""
    common = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    config = LlamaConfig(**common) if arch == "llama" else Qwen3Config(head_dim=16, **common)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # a final norm far from identity, so pre and post norm differ clearly
        model.model.norm.weight.uniform_(0.2, 3.0)
    model.save_pretrained(out)
    return out


def token_export(path: Path) -> list[dict]:
    gen = torch.Generator().manual_seed(1)
    rows = []
    for i, n in enumerate((17, 33, 9, 48)):
        ids = torch.randint(0, VOCAB, (n,), generator=gen).tolist()
        mask = [0] * (n // 2) + [1] * (n - n // 2)
        rows.append(
            {
                "id": f"s{i}",
                "sample_id": f"s{i}",
                "variant": "default",
                "k": 0,
                "input_ids": ids,
                "loss_mask": mask,
            }
        )
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return rows


def reference(model, ids: list[int]) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """transformers' own states of ``ids``: output_hidden_states, and the final norm's input (pre-norm)."""
    seen = []
    handle = model.model.norm.register_forward_pre_hook(lambda _m, a: seen.append(a[0]))
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    handle.remove()
    return tuple(h[0] for h in out.hidden_states), seen[-1][0]


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), atol=0.02, rtol=0.02)


def compute(
    work: Path, model_dir: Path, model, tokenized: Path, last_layer: str, shift: int, dtype: str = "bf16"
) -> Path:
    aux = tuple(i + shift for i in eagle3_layers(LAYERS))
    layer_ids = (*aux, LAYERS)
    settings = FeatureSettings(
        str(model_dir), layer_ids, LAYER_CONVENTION, last_layer, dtype, HIDDEN, "transformers"
    )
    shard_dir = work / f"features-{last_layer}-{dtype}" / "00000"
    backend = TransformersBackend(model, layer_ids, last_layer)
    rows = chosen(read_token_rows(tokenized), RowChoice())
    run_shard(
        rows=rows,
        shard_dir=shard_dir,
        shard="00000",
        settings=settings,
        backend=backend,
        about={},
        batch_tokens=64,  # the export's rows of 17, 33, 9 and 48 tokens: some batches hold two
    )
    return shard_dir


def specforge_checks(model, rows: list[dict], files: list[str]) -> dict:
    """SpecForge's OfflineEagle3Dataset over the export, each sample against the reference."""
    dataset = OfflineEagle3Dataset(files, max_len=4096)
    by_ids = {tuple(r["input_ids"]): r for r in rows}
    out = {"rows": len(dataset), "aux_equal": 0, "target_equal_post_norm": 0, "target_equal_pre_norm": 0}
    for i in range(len(dataset)):
        sample = dataset[i]
        ids = sample["input_ids"][0].tolist()
        assert tuple(ids) in by_ids
        states, pre = reference(model, ids)
        want_aux = torch.cat([states[j] for j in eagle3_layers(LAYERS)], dim=-1)
        out["aux_equal"] += close(sample["hidden_state"][0], want_aux)
        out["target_equal_post_norm"] += close(sample["target"][0], states[LAYERS])
        out["target_equal_pre_norm"] += close(sample["target"][0], pre)
    return out


def speculators_checks(model, data_dir: Path) -> dict:
    """speculators' ArrowDataset and CollateFn over the export, each sample against the reference."""
    dataset = ArrowDataset(max_len=4096, datapath=str(data_dir), on_missing="raise")
    out = {"rows": len(dataset), "aux_equal": 0, "last_equal_pre_norm": 0, "last_equal_post_norm": 0}
    for i in range(len(dataset)):
        sample = dataset[i]
        states, pre = reference(model, sample["input_ids"].tolist())
        want_aux = torch.cat([states[j] for j in eagle3_layers(LAYERS)], dim=-1)
        out["aux_equal"] += close(sample["hidden_states"], want_aux)
        out["last_equal_pre_norm"] += close(sample["verifier_last_hidden_states"], pre)
        out["last_equal_post_norm"] += close(sample["verifier_last_hidden_states"], states[LAYERS])
    collate = CollateFn(max_len=256, hidden_size=HIDDEN, num_target_layers=3)
    batch = collate([dataset[i] for i in range(len(dataset))])
    out["batch_hidden_shape"] = list(batch["hidden_states"].shape)
    out["train_losses"] = train_steps(model, batch)
    return out


def specforge_train_steps(target, files: list[str], steps: int = 6) -> list[float]:
    """SpecForge's own EAGLE-3 training model (``OnlineEagle3Model`` over a one-layer
    ``LlamaForCausalLMEagle3``, full vocabulary) on the first exported row, the teacher from the stored target
    state through the target's lm_head (``target_hidden_for_compact``), as its offline training does; the
    summed TTT losses per step. On CPU its Triton loss is answered by ``bench/loop/reference_loss`` (on
    PYTHONPATH: the test puts it there)."""
    from specforge.algorithms.eagle3.model import OnlineEagle3Model
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    cfg.draft_vocab_size = VOCAB
    torch.manual_seed(0)
    draft = LlamaForCausalLMEagle3(cfg, attention_backend="sdpa")
    draft.t2d = torch.ones(VOCAB, dtype=torch.bool)  # full vocabulary: identity mapping
    draft.d2t = torch.zeros(VOCAB, dtype=torch.long)
    model = OnlineEagle3Model(draft, length=2, attention_backend="sdpa")
    sample = OfflineEagle3Dataset(files, max_len=4096)[0]
    opt = torch.optim.AdamW(draft.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        out = model(
            input_ids=sample["input_ids"],
            attention_mask=sample["attention_mask"],
            target=None,
            loss_mask=sample["loss_mask"].unsqueeze(-1),  # [batch, tokens, 1], as its collator makes it
            hidden_states=sample["hidden_state"].float(),
            target_hidden_for_compact=sample["target"].float(),
            target_head_weight=target.lm_head.weight.detach(),
        )
        loss = sum(out[0])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


class PackedLikeSGLang:
    """What SGLang's capture hands back, made from transformers' states: the captured layers' states packed on
    the hidden axis in layer order (``pack_aux_hidden_states``) and the last after the norm; it records the
    ids given to ``set_eagle3_layers_to_capture`` (SpecForge's convention)."""

    def __init__(self, model) -> None:
        self.model = model
        self.setter_ids: list[int] = []

    def set_capture_layers(self, layer_ids: list[int], capture_method: str) -> None:
        self.setter_ids = list(layer_ids)

    def capture_rows(self, rows: list[list[int]]):
        captured = sorted(i + 1 for i in self.setter_ids)  # SGLang's layers_to_capture: the setter adds one
        aux, last = [], []
        for ids in rows:
            states, _ = reference(self.model, ids)
            aux.append(torch.cat([states[i] for i in captured], dim=-1))
            last.append(states[LAYERS])
        return aux, last


def sglang_adapter_checks(model, rows: list[dict]) -> dict:
    """The SGLang adapter's convention glue (ids to SGLang's setter, unpacking, the last layer) against the
    transformers backend, on states shaped as SGLang returns them; SGLang itself is not run here."""
    layer_ids = (5, 2, 4, LAYERS)  # out of order on purpose: the model captures in layer order
    inner = PackedLikeSGLang(model)
    adapter = SGLangBackend(inner, layer_ids, LAYERS, "post_norm")
    reference_backend = TransformersBackend(model, layer_ids, "post_norm")
    equal = sum(
        close(adapter.capture(r["input_ids"]), reference_backend.capture(r["input_ids"])) for r in rows
    )
    # every row in one extend, as compute_rows hands a batch: split back per row in the same layout
    batched = adapter.capture_many([r["input_ids"] for r in rows])
    equal_batched = sum(
        close(states, reference_backend.capture(r["input_ids"]))
        for states, r in zip(batched, rows, strict=True)
    )
    try:
        SGLangBackend(inner, layer_ids, LAYERS, "pre_norm")
        pre_norm_refused = False
    except ValueError:
        pre_norm_refused = True
    return {
        "setter_ids": inner.setter_ids,
        "equal": equal,
        "equal_batched": equal_batched,
        "pre_norm_refused": pre_norm_refused,
    }


def fp8_checks(model, data_dir: Path) -> dict:
    """speculators' ArrowDataset over hs_connectors' FP8Transfer (it dequantizes our per-token scales): every
    sample within fp8 e4m3's precision (3 mantissa bits) of the reference, at the token's largest value."""
    dataset = ArrowDataset(
        max_len=4096,
        datapath=str(data_dir),
        on_missing="raise",
        transfer=FP8Transfer(data_dir / "hidden_states"),
    )
    out = {"rows": len(dataset), "close": 0}
    for i in range(len(dataset)):
        sample = dataset[i]
        states, pre = reference(model, sample["input_ids"].tolist())
        want = torch.cat([*(states[j] for j in eagle3_layers(LAYERS)), pre], dim=-1)
        got = torch.cat([sample["hidden_states"], sample["verifier_last_hidden_states"]], dim=-1).float()
        amax = want.abs().amax(dim=-1, keepdim=True)
        out["close"] += bool(((got - want).abs() <= 0.07 * amax).all())
    return out


def manifest_bytes(shard_dir: Path) -> int:
    return json.loads((shard_dir / "_manifest.json").read_text())["bytes"]


def train_steps(model, batch: dict, steps: int = 5) -> list[float]:
    """A few optimizer steps of an EAGLE-style head on speculators' batch: the three auxiliary layers through
    a trained fc, then the target's own final norm and lm_head, towards the target's next-token distribution
    (its lm_head over verifier_last_hidden_states after the norm)."""
    hidden = batch["hidden_states"][0].float()
    last = batch["verifier_last_hidden_states"][0].float()
    mask = batch["loss_mask"][0].bool()
    norm, head = model.model.norm, model.lm_head
    with torch.no_grad():
        teacher = torch.log_softmax(head(norm(last[1:])), dim=-1)
    fc = torch.nn.Linear(3 * HIDDEN, HIDDEN)
    opt = torch.optim.AdamW(fc.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        logp = torch.log_softmax(head(norm(fc(hidden[:-1]))), dim=-1)
        loss = -(teacher.exp() * logp).sum(-1)[mask[1:]].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def main() -> None:
    work, arch = Path(sys.argv[1]), sys.argv[2]
    shift = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    work.mkdir(parents=True, exist_ok=True)
    model_dir = tiny_model(arch, work / f"model-{arch}")
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    tokenized = work / "tokenized.jsonl"
    rows = token_export(tokenized)
    post = compute(work, model_dir, model, tokenized, "post_norm", shift)
    pre = compute(work, model_dir, model, tokenized, "pre_norm", shift)
    fp8 = compute(work, model_dir, model, tokenized, "pre_norm", shift, dtype="fp8")
    to_speculators([fp8], str(tokenized), str(work / "speculators-fp8"))
    to_specforge([post], str(tokenized), str(work / "specforge"))
    to_speculators([pre], str(tokenized), str(work / "speculators"))
    refused = {}
    for name, fn, shard in (("specforge", to_specforge, pre), ("speculators", to_speculators, post)):
        try:
            fn([shard], str(tokenized), str(work / f"{name}-wrong"))
        except ValueError as exc:
            refused[name] = str(exc)
    specforge_files = list_local_files(str(work / "specforge"), [".ckpt"])
    result = {
        "rows": len(rows),
        "specforge": specforge_checks(model, rows, specforge_files)
        | {"train_losses": specforge_train_steps(model, specforge_files)},
        "speculators": speculators_checks(model, work / "speculators"),
        "refused": refused,
        "sglang_adapter": sglang_adapter_checks(model, rows),
        "fp8": fp8_checks(model, work / "speculators-fp8")
        | {"bytes_vs_bf16": manifest_bytes(fp8) / manifest_bytes(pre)},
        "manifest": json.loads((post / "_manifest.json").read_text()),
    }
    (work / "features.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
