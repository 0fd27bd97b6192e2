"""The prefill engines behind one interface: token ids in, the chosen layers' states out, in one pass.

``capture(input_ids)`` returns a float tensor ``[tokens, layers, hidden]`` in ``layer_ids`` order
(``regen.features.config``'s convention: index into ``output_hidden_states``); the last layer, when stored,
before or after the final norm as ``last_layer`` says. torch is imported here, never by the rest of regen.

* :class:`TransformersBackend`: ``forward(output_hidden_states=True)``, the reference. Index ``L`` of
  transformers' tuple is the last layer *after* the final norm (transformers applies ``model.norm`` before
  it records the last state); ``pre_norm`` reads the final norm's input through a forward pre-hook instead.
* :class:`SGLangBackend`: SGLang 0.5.17's in-process ``ModelRunner`` driven as SpecForge's offline capture
  drives it (``specforge/offline_capture/sglang_backend/capture.py``), built and extended the 0.5.17 way
  (:func:`sglang_model_runner`, :class:`SGLangCapture`). NOT RUN ON A GPU YET: run on CPU (SGLang's own runner
  with ``device: cpu``, tiny random targets; ``bench/gpu/features.sh`` says how) where it matched the
  transformers reference; ``bench/gpu/features.py`` checks it on the GPU.
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
    """SGLang 0.5.17 in process (run on CPU against the reference; not yet on a GPU).

    What the source says, and what this relies on:
    * ``LlamaModel.forward`` (``sglang/srt/models/llama.py``; qwen2, qwen3 alike; ``Qwen2MoeModel``, which
      qwen3_moe extends, appends through ``captured_last_layer_outputs`` after the next layer's fused
      add-norm: the same sum) captures ``hidden_states + residual`` *before* layer ``i`` for ``i in
      model.layers_to_capture``: the output of layer ``i`` counted from 1, this module's convention as it is.
      ``set_eagle3_layers_to_capture(ids)`` adds one to SpecForge-convention ids, so it is given our ids minus
      one.
    * The last layer reaches the logits processor after ``self.norm``: post_norm only. The loop never
      captures before a layer ``L`` that does not exist, and LlamaModel passes no
      ``hidden_states_before_norm``, so ``pre_norm`` is refused here.
    * With ``CaptureHiddenMode.FULL`` the logits processor packs the aux states of every token
      (``_get_hidden_states_to_store``: ``layers/aux_hidden_states.py:pack_aux_hidden_states``, concatenated
      on the hidden axis, in layer order). SpecForge 0.2.0's logits-processor swap
      (``offline_capture/sglang_backend/utils.py``: skips the lm_head, returns ``aux_hidden_states`` and
      ``last_hidden_states``) is reused as it is: the 0.5.17 methods it calls (``_get_pruned_states``,
      ``_get_hidden_states_to_store``, ``LogitsMetadata.from_forward_batch``) keep its signatures. The rest
      of SpecForge's SGLang boundary pins 0.5.14 and does not run on 0.5.17 (:func:`sglang_capture` says
      where), so the runner and the extend are built here the 0.5.17 way.
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
        cls, path: str, layer_ids: Sequence[int], num_layers: int, last_layer: str, **server_args: Any
    ) -> SGLangBackend:
        return cls(sglang_capture(path, **server_args), layer_ids, num_layers, last_layer)

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


def sglang_model_runner(path: str, **server_args: Any) -> Any:
    """SGLang 0.5.17's ``ModelRunner`` for ``path`` in this process (TP 1, GPU 0), built the way its
    ``TpModelWorker`` builds one (``managers/tp_worker.py``: ``_init_model_runner``, then
    ``alloc_memory_pool``, ``init_attention_backends``, ``init_cuda_graphs``), with SpecForge's
    settings for offline capture (``enable_return_hidden_states``, no CUDA graphs, no chunked prefill) and
    SpecForge 0.2.0's logits-processor swap; ``server_args`` (``ServerArgs`` fields) override.

    Why not SpecForge's ``OfflineSGLangCaptureBackend.build``: it is written against 0.5.14, whose
    ``ModelRunner`` took ``tp_rank``/``tp_size``/``moe_ep_*``/``pp_*``; 0.5.17's takes one
    ``ps: ParallelState`` and a ``nccl_port``, and initialises torch.distributed itself
    (``distributed/bootstrap.py``). SpecForge's ``SGLangRunner`` override and ``patch.py`` (its own
    distributed init) import ``compute_dp_attention_local_info``, which 0.5.17's ``layers/dp_attention.py``
    no longer has, so that module does not even import."""
    import socket

    import torch
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed.parallel_state_wrapper import ParallelState
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import ServerArgs
    from specforge.offline_capture.sglang_backend.utils import wrap_offline_eagle3_logits_processors

    settings = {
        "model_path": path,
        "dtype": "auto",
        "enable_return_hidden_states": True,
        "disable_cuda_graph": True,
        "chunked_prefill_size": -1,
        "tp_size": 1,
        "pp_size": 1,
    }
    args = ServerArgs(**(settings | dict(server_args)))
    publish(args, role="scheduler")  # what run_scheduler_process does before it builds the worker
    with socket.socket() as s:  # torch.distributed's rendezvous port (world size 1)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if args.device == "cuda":
        torch.cuda.set_device(0)
    runner = ModelRunner(
        model_config=ModelConfig.from_server_args(args),
        mem_fraction_static=args.mem_fraction_static,
        gpu_id=0,
        ps=ParallelState.trivial(gpu_id=0),
        nccl_port=port,
        server_args=args,
        is_draft_worker=False,
    )
    runner.alloc_memory_pool()
    runner.init_attention_backends()
    runner.init_cuda_graphs()  # none are captured (disable_cuda_graph): this sets the eager runner
    wrap_offline_eagle3_logits_processors(runner.model)
    return runner


class SGLangCapture:
    """One extend of whole rows on a :func:`sglang_model_runner`, every token's captured states back.

    The extend is SpecForge 0.2.0's ``OfflineSGLangCaptureBackend._forward_extend`` and ``capture_eagle3``
    (a ``ScheduleBatch`` of one ``Req`` a row over the runner's pools and a ``RadixCache``,
    ``prepare_for_extend``, ``CaptureHiddenMode.FULL``, the runner's ``forward``, pools cleared after),
    with the two calls 0.5.17 changed: a request's extent is ``req.set_extend_range(prefix, end)``
    (``prepare_for_extend`` reads only ``extend_range``; 0.5.14's ``fill_len``/``extend_input_len`` are
    gone), and ``ForwardBatch.init_new`` takes ``capture_hidden_mode`` and a required
    ``return_hidden_states_before_norm``."""

    def __init__(self, runner: Any) -> None:
        self.model_runner = runner

    def set_capture_layers(self, layer_ids: list[int], *, capture_method: str = "eagle3") -> None:
        if capture_method != "eagle3":
            raise ValueError(f"capture_method {capture_method!r}: only eagle3 is wired here")
        self.model_runner.model.set_eagle3_layers_to_capture(list(layer_ids))

    def capture_rows(self, rows: list[list[int]]) -> tuple[Any, Any]:
        """Per row: its aux states ``[tokens, aux x hidden]`` and its last layer ``[tokens, hidden]``."""
        import torch

        with torch.no_grad():
            out = self.extend([sglang_request(str(i), ids) for i, ids in enumerate(rows)])
        aux, last = getattr(out, "aux_hidden_states", None), getattr(out, "last_hidden_states", None)
        if aux is None or last is None:
            raise RuntimeError(f"SGLang returned no captured states ({type(out).__name__})")
        lengths = [len(ids) for ids in rows]
        return torch.split(aux, lengths), torch.split(last, lengths)

    def extend(self, reqs: list[Any]) -> Any:
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.radix_cache import RadixCache
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        runner = self.model_runner
        try:
            batch = ScheduleBatch.init_new(
                reqs=reqs,
                req_to_token_pool=runner.req_to_token_pool,
                token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator,
                tree_cache=RadixCache(
                    CacheInitParams(
                        disable=False,
                        req_to_token_pool=runner.req_to_token_pool,
                        token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator,
                        page_size=runner.server_args.page_size,
                    )
                ),
                model_config=runner.model_config,
                enable_overlap=False,
                spec_algorithm=SpeculativeAlgorithm.NONE,
            )
            batch.prepare_for_extend()
            if getattr(batch, "prefill_input_ids_cpu", None) is not None:  # the scheduler's H2D copy
                batch.input_ids = batch.prefill_input_ids_cpu.to(batch.device, non_blocking=True)
                batch.prefill_input_ids_cpu = None
            forward_batch = ForwardBatch.init_new(
                batch,
                runner,
                capture_hidden_mode=CaptureHiddenMode.FULL,
                return_hidden_states_before_norm=False,
            )
            out = runner.forward(forward_batch)
            return out.logits_output if hasattr(out, "logits_output") else out
        finally:
            runner.req_to_token_pool.clear()
            runner.token_to_kv_pool_allocator.clear()


def sglang_request(rid: str, ids: Sequence[int]) -> Any:
    """A 0.5.17 ``Req`` prefilling all of ``ids`` (no prefix cached), as SpecForge's capture builds it."""
    from array import array

    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req(
        rid=rid,
        origin_input_text="",
        origin_input_ids=array("q", ids),
        sampling_params=SamplingParams(temperature=0, max_new_tokens=1, top_k=1),
    )
    req.full_untruncated_fill_ids = array("q", ids)
    req.set_extend_range(len(req.prefix_indices), len(ids))
    req.logprob_start_len = len(ids) - 1
    return req


def sglang_capture(path: str, **server_args: Any) -> SGLangCapture:
    """SGLang 0.5.17 in this process (TP 1) capturing whole rows: :class:`SGLangCapture` over
    :func:`sglang_model_runner`."""
    return SGLangCapture(sglang_model_runner(path, **server_args))
