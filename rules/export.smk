# Exports drafter trainers read as they are (regen.output.export): SpecForge conversations and
# token-exact input_ids/loss_mask from the server's own ids (one mask policy: regen.output.masks).
rule export:
    input:
        dataset=rules.merge.output.dataset,
        ready=rules.reaudit.output.ready,
    output:
        specforge=RUN.export_specforge,
        tokenized=RUN.export_tokenized,
        # the held-out eval split, beside the training files (regen.layout.beside.eval_split_beside)
        specforge_eval=RUN.export_specforge_eval,
        tokenized_eval=RUN.export_tokenized_eval,
        # supervised-token counts for the draft vocabulary (regen.layout.beside.token_freq_beside, regen vocab)
        token_freq=RUN.export_token_freq,
        # each row's thinking mode and split side (regen.layout.beside.thinking_beside; the manifest's serving block)
        thinking=RUN.export_thinking,
        manifest=reported(
            RUN.export_manifest,
            caption="../report/export.rst",
            category="4. Output audit",
            labels={"result": "trainer files: manifest"},
        ),
    log:
        RUN.log("export"),
    conda:
        "../envs/regen.yaml"
    params:
        export=lookup(dpath="export", within=config),
        tokenizer=lookup(dpath="tokenizer", within=config),
        regenerate=lookup(dpath="generate/regenerate", within=config),
    script:
        "../scripts/export.py"
