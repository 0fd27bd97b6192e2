# The report's pages: plots, gate tables, the server memory map and the landing page (READY or not, why).
# `snakemake --report` uses results/report/landing.rst as its first page once it exists (Snakefile `report:`).
rule report_assets:
    input:
        dataset="results/dataset",
        reconcile="results/reconcile.json",
        audit="results/audit/summary.json",
        reaudit="results/reaudit/summary.json",
        plan="results/plan/server.json",
        records=shard_files("results/generations/{shard}.jsonl.zst"),
        quarantine=shard_files("results/quarantine/{shard}.jsonl.zst"),
    output:
        throughput=report(
            "results/report/throughput.svg",
            caption="../report/throughput.rst",
            category="3. Generation",
        ),
        lengths=report(
            "results/report/token_lengths.svg",
            caption="../report/token_lengths.rst",
            category="3. Generation",
        ),
        finish=report(
            "results/report/finish_reasons.svg",
            caption="../report/finish_reasons.rst",
            category="3. Generation",
        ),
        quarantine=report(
            "results/report/quarantine_reasons.svg",
            caption="../report/quarantine_reasons.rst",
            category="3. Generation",
        ),
        window=report(
            "results/report/trainer_window.svg",
            caption="../report/trainer_window.rst",
            category="4. Output audit",
        ),
        plan=report(
            "results/report/server_plan.html",
            caption="../report/plan.rst",
            category="2. Server plan",
        ),
        audit=report(
            "results/report/audit.html",
            caption="../report/audit.rst",
            category="1. Input audit",
        ),
        reaudit=report(
            "results/report/reaudit.html",
            caption="../report/reaudit.rst",
            category="4. Output audit",
        ),
        reconcile=report(
            "results/report/reconcile.html",
            caption="../report/reconcile.rst",
            category="5. Reconciliation",
        ),
        landing="results/report/landing.rst",
    log:
        "logs/report_assets.log",
    conda:
        "../envs/regen.yaml"
    params:
        dataset=lookup(dpath="dataset/path", within=config),
        model=lookup(dpath="server/model_path", within=config),
        mode=lookup(dpath="server/mode", within=config),
        shards=lookup(dpath="shards/count", within=config),
    script:
        "../scripts/report_assets.py"
