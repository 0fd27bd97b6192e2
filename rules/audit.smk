rule audit:
    input:
        dataset=dataset_path(),
        benchmarks=benchmark_files(),
    output:
        summary=reported(
            RUN.audit.summary,
            caption="../report/audit.rst",
            category="1. Input audit",
            labels={"result": "input audit: summary (JSON)"},
        ),
        flags=RUN.audit.flags,
        excluded=RUN.audit.excluded,
        samples=RUN.audit.samples,
        supervised_plot=reported(
            RUN.audit.supervised_plot,
            caption="../report/audit_supervised.rst",
            category="1. Input audit",
            labels={"result": "input audit: supervised tokens per sample"},
        ),
        prompt_plot=reported(
            RUN.audit.prompt_plot,
            caption="../report/audit_prompt.rst",
            category="1. Input audit",
            labels={"result": "input audit: prompt tokens per sample"},
        ),
    log:
        RUN.log("audit"),
        # the gate's verdict, kept when a failed gate fails the job (regen.verdict)
        verdict=RUN.verdict("audit"),
        # a failed audit's excluded rows with their reasons (Snakemake deletes excluded.jsonl then)
        excluded=RUN.kept_excluded("audit"),
    benchmark:
        RUN.benchmark("audit")
    conda:
        "../envs/regen.yaml"
    params:
        dataset=lookup(dpath="dataset", within=config),
        audit=lookup(dpath="audit", within=config),
        tokenizer=lookup(dpath="tokenizer", within=config),
        # which old answers this run replaces decides which empty ones the gate judges
        regenerate=lookup(dpath="generate/regenerate", within=config),
    script:
        "../scripts/audit.py"
