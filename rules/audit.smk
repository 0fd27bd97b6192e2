rule audit:
    input:
        dataset=dataset_path(),
        benchmarks=benchmark_files(),
    output:
        summary=report(
            "results/audit/summary.json",
            caption="../report/audit.rst",
            category="1. Input audit",
        ),
        flags="results/audit/flags.parquet",
        excluded="results/audit/excluded.jsonl",
        samples="results/audit/samples.parquet",
        supervised_plot=report(
            "results/audit/supervised_tokens.svg",
            caption="../report/audit_supervised.rst",
            category="1. Input audit",
        ),
        prompt_plot=report(
            "results/audit/prompt_tokens.svg",
            caption="../report/audit_prompt.rst",
            category="1. Input audit",
        ),
    log:
        "logs/audit.log",
    benchmark:
        "benchmarks/audit.tsv"
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
