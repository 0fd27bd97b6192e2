# Exports drafter trainers read as they are (regen.export): SpecForge conversations and
# token-exact input_ids/loss_mask from the server's own ids (one mask policy: regen.masks).
rule export:
    input:
        dataset="results/dataset",
        ready="results/READY.json",
    output:
        specforge="results/export/specforge.jsonl",
        tokenized="results/export/tokenized.jsonl",
        # the held-out eval split, beside the training files (regen.export.eval_path)
        specforge_eval="results/export/specforge.eval.jsonl",
        tokenized_eval="results/export/tokenized.eval.jsonl",
        # supervised-token counts for the draft vocabulary (regen.export.token_freq_path, regen vocab)
        token_freq="results/export/token_freq.json",
        # each row's thinking mode and split side (regen.export.thinking_path; the manifest's serving block)
        thinking="results/export/thinking.jsonl",
        manifest=report(
            "results/export/manifest.json",
            caption="../report/export.rst",
            category="4. Output audit",
        ),
    log:
        "logs/export.log",
    conda:
        "../envs/regen.yaml"
    params:
        export=lookup(dpath="export", within=config),
        tokenizer=lookup(dpath="tokenizer", within=config),
        regenerate=lookup(dpath="generate/regenerate", within=config),
    script:
        "../scripts/export.py"
