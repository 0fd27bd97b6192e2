"""The prefill engines behind one interface: token ids in, the chosen layers' states out, in one pass.

``capture(input_ids)`` returns a float tensor ``[tokens, layers, hidden]`` in ``layer_ids`` order
(``regen.features.config``'s convention: index into ``output_hidden_states``); the last layer, when stored,
before or after the final norm as ``last_layer`` says. torch is imported here, never by the rest of regen.

* :class:`TransformersBackend`: ``forward(output_hidden_states=True)``, the reference. Index ``L`` of
  transformers' tuple is the last layer *after* the final norm (transformers applies ``model.norm`` before
  it records the last state); ``pre_norm`` reads the final norm's input through a forward pre-hook instead.
* :class:`SGLangBackend`: SGLang 0.5.17's in-process ``ModelRunner`` as SpecForge's offline capture drives it
  (``specforge/offline_capture/sglang_backend/capture.py``). NOT RUN ON A GPU YET: written from SGLang
  0.5.17's source and SpecForge's use of it; a GPU run must check it against the reference first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from regen.features.store import StoredTensor

FP8_MAX = 448.0  # float8_e4m3fn's largest finite value


class CaptureBackend(Protocol):
    """One engine's prefill over rows of token ids."""

    name: str

    def capture(self, input_ids: Sequence[int]) -> Any:
        """``[tokens, layers, hidden]`` float states of ``input_ids``, layers in the configured order."""

    def capture_many(self, rows: Sequence[Sequence[int]]) -> list[Any]:
        """:meth:`capture` of each of ``rows`` (whole rows, never padded), in as few forwards as the engine
        can; ``regen.features.compute`` hands it up to ``features.batch_tokens`` tokens at once."""


def encode(states: Any, input_ids: Sequence[int], dtype: str) -> list[StoredTensor]:
    """A row's tensors for the store: ``token_ids`` (I64), ``hidden_states`` (BF16, or F8_E4M3 with
    ``hidden_states_scales``, F32 ``[tokens, 1, 1]``: one scale per token over its layers, hs_connectors'
    ``fp8_utils`` format, which speculators' FP8 file transfer dequantizes as it reads)."""
    import torch

    states = states.detach().to("cpu")
    ids = torch.tensor(list(input_ids), dtype=torch.int64)
    out = [StoredTensor("token_ids", "I64", tuple(ids.shape), ids.numpy().tobytes())]
    if dtype == "bf16":
        values = states.to(torch.bfloat16).contiguous()
        out.append(
            StoredTensor(
                "hidden_states", "BF16", tuple(values.shape), values.view(torch.int16).numpy().tobytes()
            )
        )
        return out
    wide = states.float()
    scale = (wide.abs().amax(dim=(1, 2), keepdim=True) / FP8_MAX).clamp(min=1e-12)
    values = (wide / scale).to(torch.float8_e4m3fn).contiguous()
    out.append(
        StoredTensor(
            "hidden_states", "F8_E4M3", tuple(values.shape), values.view(torch.uint8).numpy().tobytes()
        )
    )
    out.append(
        StoredTensor("hidden_states_scales", "F32", tuple(scale.shape), scale.contiguous().numpy().tobytes())
    )
    return out


class TransformersBackend:
    """The reference: a transformers causal LM's forward with ``output_hidden_states``."""

    name = "transformers"

    def __init__(self, model: Any, layer_ids: Sequence[int], last_layer: str) -> None:
        self.model = model.eval()
        self.layer_ids = tuple(layer_ids)
        self.last_layer = last_layer
        self.num_layers = int(model.config.num_hidden_layers)
        self._pre_norm: list[Any] = []
        if last_layer == "pre_norm":
            model.model.norm.register_forward_pre_hook(lambda _m, args: self._pre_norm.append(args[0]))

    @classmethod
    def from_pretrained(
        cls, path: str, layer_ids: Sequence[int], last_layer: str, device: str = "cuda"
    ) -> TransformersBackend:
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16).to(device)
        return cls(model, layer_ids, last_layer)

    def capture(self, input_ids: Sequence[int]) -> Any:
        import torch

        self._pre_norm.clear()
        device = next(self.model.parameters()).device
        with torch.no_grad():
            out = self.model.model(
                input_ids=torch.tensor([list(input_ids)], device=device),
                output_hidden_states=True,
                use_cache=False,
            )
        states = out.hidden_states  # (embeddings, layer 1, ..., layer L after the final norm)
        picked = []
        for i in self.layer_ids:
            if i == self.num_layers and self.last_layer == "pre_norm":
                picked.append(self._pre_norm[-1][0])
            else:
                picked.append(states[i][0])
        return torch.stack(picked, dim=1)

    def capture_many(self, rows: Sequence[Sequence[int]]) -> list[Any]:
        """One forward a row: transformers would pad rows of unequal length into one batch."""
        return [self.capture(ids) for ids in rows]


class SGLangBackend:
    """SGLang 0.5.17 in process (UNVERIFIED: not yet run on a GPU).

    What the source says, and what this relies on:
    * ``LlamaModel.forward`` (``sglang/srt/models/llama.py``; qwen2, qwen3, qwen3_moe alike) appends
      ``hidden_states + residual`` *before* layer ``i`` for ``i in model.layers_to_capture``: the output of
      layer ``i`` counted from 1, this module's convention as it is. ``set_eagle3_layers_to_capture(ids)``
      adds one to SpecForge-convention ids, so it is given our ids minus one.
    * The last layer reaches the logits processor after ``self.norm``: post_norm only. The loop never
      captures before a layer ``L`` that does not exist, and LlamaModel passes no
      ``hidden_states_before_norm``, so ``pre_norm`` is refused here.
    * With ``CaptureHiddenMode.FULL`` the logits processor packs the aux states of every token
      (``_get_hidden_states_to_store``: ``layers/aux_hidden_states.py:pack_aux_hidden_states``, concatenated
      on the hidden axis, in layer order). SpecForge 0.2.0's ``OfflineSGLangCaptureBackend`` builds the
      ModelRunner, swaps in a logits processor that skips the lm_head and returns ``aux_hidden_states`` and
      ``last_hidden_states``, and runs one extend (``_forward_extend``); that is reused. Its request
      building is not: SpecForge pins SGLang 0.5.14 and sets ``req.fill_len`` / ``req.extend_input_len``,
      which 0.5.17's ``Req`` replaced with ``extend_range`` (``set_extend_range``; ``prepare_for_extend``
      reads only it), so :func:`sglang_capture` builds the requests the 0.5.17 way.
    * Transport stays in process: tensors on the GPU, copied to the host once per row; no JSON floats.
    """

    name = "sglang"

    def __init__(
        self, capture_backend: Any, layer_ids: Sequence[int], num_layers: int, last_layer: str
    ) -> None:
        if last_layer == "pre_norm":
            raise ValueError(
                "features.last_layer: pre_norm: SGLang 0.5.17 hands the last layer to the logits processor "
                "after the final norm only; use backend: transformers, or last_layer: post_norm"
            )
        self.inner = capture_backend
        self.layer_ids = tuple(layer_ids)
        self.num_layers = num_layers
        self.aux_ids = [i for i in self.layer_ids if not (i == num_layers and last_layer == "post_norm")]
        # SGLang's setter adds one (after-layer ids in); its layers_to_capture are then our ids
        self.inner.set_capture_layers([i - 1 for i in self.aux_ids], capture_method="eagle3")

    @classmethod
    def from_pretrained(
        cls, path: str, layer_ids: Sequence[int], num_layers: int, last_layer: str
    ) -> SGLangBackend:
        return cls(sglang_capture(path), layer_ids, num_layers, last_layer)

    def capture(self, input_ids: Sequence[int]) -> Any:
        return self.capture_many([input_ids])[0]

    def capture_many(self, rows: Sequence[Sequence[int]]) -> list[Any]:
        """The rows in one extend (SGLang packs them, unpadded), split back per row."""
        import torch

        aux_rows, last_rows = self.inner.capture_rows([list(ids) for ids in rows])
        order = sorted(self.aux_ids)  # the model appends in layer order, whatever order we asked in
        out = []
        for ids, aux_row, last in zip(rows, aux_rows, last_rows, strict=True):
            aux = aux_row.reshape(len(ids), len(self.aux_ids), -1)
            parts = {layer: aux[:, order.index(layer)] for layer in self.aux_ids}
            if len(self.aux_ids) < len(self.layer_ids):
                parts[self.num_layers] = last
            out.append(torch.stack([parts[i] for i in self.layer_ids], dim=1))
        return out


def sglang_capture(path: str) -> Any:
    """SpecForge's offline SGLang capture (one process, TP 1) with requests built for SGLang 0.5.17."""
    import os
    from array import array

    import torch
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams
    from specforge.distributed import init_distributed
    from specforge.offline_capture.sglang_backend.capture import OfflineSGLangCaptureBackend

    class Capture(OfflineSGLangCaptureBackend):
        @torch.no_grad()
        def capture_rows(self, rows: list[list[int]]) -> tuple[Any, Any]:
            params = SamplingParams(temperature=0, max_new_tokens=1, top_k=1)
            reqs = []
            for i, ids in enumerate(rows):
                req = Req(
                    rid=str(i), origin_input_text="", origin_input_ids=array("q", ids), sampling_params=params
                )
                req.full_untruncated_fill_ids = array("q", ids)
                req.set_extend_range(len(req.prefix_indices), len(ids))
                req.logprob_start_len = len(ids) - 1
                reqs.append(req)
            try:
                out = self._forward_extend(reqs)
                lengths = [len(ids) for ids in rows]
                return torch.split(out.aux_hidden_states, lengths), torch.split(
                    out.last_hidden_states, lengths
                )
            finally:
                self._clear_pools()

    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", "29517")
    init_distributed(tp_size=1)
    return Capture.build(path)
