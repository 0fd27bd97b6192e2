rule report_assets:
    input:
        dataset="results/dataset",
        reconcile="results/reconcile.json",
        audit="results/audit/summary.json",
        plan="results/plan/server.json",
        records=shard_files("results/generations/{shard}.jsonl"),
        quarantine=shard_files("results/quarantine/{shard}.jsonl"),
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
        plan=report(
            "results/report/server_plan.html",
            caption="../report/plan.rst",
            category="2. Server plan",
        ),
        reconcile=report(
            "results/report/reconcile.html",
            caption="../report/reconcile.rst",
            category="5. Reconciliation",
        ),
    log:
        "logs/report_assets.log",
    conda:
        "../envs/regen.yaml"
    script:
        "../scripts/report_assets.py"
