"""The race's offline arm (issue 57): SGLang's own offline engine with its defaults, every request at once.

Run by ``bench.gpu.race`` in its own process: ``python -m bench.gpu.race_offline MODEL_DIR INPUT OUT``.
INPUT is the workload as JSON (``prompts``, ``max_tokens``, ``sampling``, and ``engine_args``: the flags every
arm launches with, as the engine's keywords), written by the race; nothing of
regen is imported here. OUT gets ``start_s`` (process start to engine ready), ``generation_s`` (the one
``generate`` call) and the answers' token count.
"""

import json
import sys
import time

T0 = time.monotonic()


def main() -> int:
    import sglang

    model_dir, given, out = sys.argv[1:4]
    with open(given) as fh:
        work = json.load(fh)
    engine = sglang.Engine(
        model_path=model_dir, load_format="dummy", log_level="info", **work.get("engine_args", {})
    )
    start_s = time.monotonic() - T0
    params = [{"max_new_tokens": n, "ignore_eos": True, **work["sampling"]} for n in work["max_tokens"]]
    t = time.monotonic()
    answers = engine.generate(prompt=work["prompts"], sampling_params=params)
    generation_s = time.monotonic() - t
    tokens = sum(int(a["meta_info"]["completion_tokens"]) for a in answers)
    engine.shutdown()
    result = {
        "start_s": round(start_s, 2),
        "generation_s": round(generation_s, 2),
        "output_tokens": tokens,
        "answers": len(answers),
    }
    with open(out + ".tmp", "w") as fh:
        json.dump(result, fh)
    import os

    os.replace(out + ".tmp", out)
    print("offline:", json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
