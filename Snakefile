# regen: raw chat dataset -> audit -> prompt shards -> generation on SGLang -> validation -> training-ready Parquet.
# This file is a table of contents; the rules live in rules/*.smk and the logic in the regen package.
#
#   snakemake --cores all --resources gpu=7                       # a GPU node, config/config.yaml
#   snakemake --cores all --configfile config/demo.yaml           # the bundled demo, simulated servers
#   snakemake -n                                                  # preview the remaining work


from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/audit.smk"
include: "rules/shard.smk"
include: "rules/tune.smk"
include: "rules/generate.smk"
include: "rules/validate.smk"
include: "rules/merge.smk"
include: "rules/reaudit.smk"
include: "rules/reconcile.smk"
include: "rules/report.smk"
include: "rules/publish.smk"
include: "rules/export.smk"
include: "rules/features.smk"


report: report_landing_page()


localrules:
    all,
    audit,
    shard,
    shard_count,
    tune,
    validate,
    merge,
    reaudit,
    reconcile,
    report_assets,
    publish,
    export,


rule all:
    default_target: True
    input:
        final_outputs,


# the run's start and end: regen.run_hooks.RunHooks (rules/common.smk builds HOOKS)
onstart:
    HOOKS.on_start()


onsuccess:
    HOOKS.on_success()


onerror:
    HOOKS.on_error(log)
