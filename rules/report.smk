# The report's pages: plots, gate tables, the server memory map and the landing page (READY or not, why).
# `snakemake --report` uses its landing.rst as its first page once it exists (Snakefile `report:`).
rule report_assets:
    input:
        dataset=rules.merge.output.dataset,
        reconcile=rules.reconcile.output.table,
        audit=rules.audit.output.summary,
        audit_verdict=rules.audit.log.verdict,
        reaudit=rules.reaudit.output.summary,
        reaudit_verdict=rules.reaudit.log.verdict,
        ready=rules.reaudit.output.ready,
        plan=rules.tune.output.plan,
        # `regen tune --sweep`'s pilot, when one was run before the workflow
        pilot=pilot_file(),
        records=shard_files(rules.generate.output.records),
        failed=shard_files(rules.generate.output.failed),
        quarantine=shard_files(rules.validate.output.quarantine),
    output:
        throughput=reported(
            RUN.report_asset(THROUGHPUT_SVG),
            caption="../report/throughput.rst",
            category="3. Generation",
            labels={"result": "throughput per server over time"},
        ),
        lengths=reported(
            RUN.report_asset(TOKEN_LENGTHS_SVG),
            caption="../report/token_lengths.rst",
            category="3. Generation",
            labels={"result": "token lengths per row"},
        ),
        finish=reported(
            RUN.report_asset(FINISH_REASONS_SVG),
            caption="../report/finish_reasons.rst",
            category="3. Generation",
            labels={"result": "finish reasons"},
        ),
        quarantine=reported(
            RUN.report_asset(QUARANTINE_REASONS_SVG),
            caption="../report/quarantine_reasons.rst",
            category="3. Generation",
            labels={"result": "quarantine reasons"},
        ),
        window=reported(
            RUN.report_asset(TRAINER_WINDOW_SVG),
            caption="../report/trainer_window.rst",
            category="4. Output audit",
            labels={"result": "what fits the trainer's window"},
        ),
        plan=reported(
            RUN.report_asset(SERVER_PLAN_HTML),
            caption="../report/plan.rst",
            category="2. Server plan",
            labels={"result": "server plan: memory map, predicted and realized"},
        ),
        audit=reported(
            RUN.report_asset(AUDIT_HTML),
            caption="../report/audit.rst",
            category="1. Input audit",
            labels={"result": "input audit: gates and flags"},
        ),
        reaudit=reported(
            RUN.report_asset(REAUDIT_HTML),
            caption="../report/reaudit.rst",
            category="4. Output audit",
            labels={"result": "output audit: gates"},
        ),
        reconcile=reported(
            RUN.report_asset(RECONCILE_HTML),
            caption="../report/reconcile.rst",
            category="5. Reconciliation",
            labels={"result": "reconciliation: every input id in one bucket"},
        ),
        landing=RUN.report_asset(LANDING_RST),
    log:
        RUN.log("report_assets"),
    conda:
        "../envs/regen.yaml"
    params:
        dataset=lookup(dpath="dataset/path", within=config),
        model=lookup(dpath="server/model_path", within=config),
        mode=lookup(dpath="server/mode", within=config),
        # the plan's count (shards.count auto settled to a number)
        shards=len(SHARDS),
        # the first page's features projection (regen.features.projection), read with the whole config
        features=lookup(dpath="features", within=config),
        # the GPU slots' realized memory maps and restarts: the long-lived servers' files, no job's output
        servers=RUN.servers_root,
    script:
        "../scripts/report_assets.py"
