# Config validation (once, with the schema's defaults filled in) and named input functions.
import os

from snakemake.utils import validate

from regen.layout import RUN
from regen.shards import shard_name
from regen.sglang.server import stop_all_servers

validate(config, schema="../schemas/config.schema.yaml")


# s3:// inputs and outputs; endpoint and credentials come from the usual AWS environment/config chain.
S3_ENDPOINT = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get(
    "AWS_ENDPOINT_URL"
)


storage s3:
    provider="s3",
    endpoint_url=S3_ENDPOINT,
    retries=10,


SHARDS = [shard_name(k) for k in range(lookup(dpath="shards/count", within=config))]


wildcard_constraints:
    shard=r"\d{5}",


def dataset_path():
    """The input dataset: a local path, or an s3:// URI fetched by the S3 storage plugin."""
    path = lookup(dpath="dataset/path", within=config)
    return storage.s3(path) if path.startswith("s3://") else path


def gpu_slots():
    """GPU slots on this node: --resources gpu=N when given, else server.gpus."""
    given = workflow.global_resources.get("gpu")
    value = getattr(given, "value", given)
    return int(value) if value else lookup(dpath="server/gpus", within=config)


def shard_files(pattern):
    """One path per shard: every per-shard job is known at plan time."""
    return expand(pattern, shard=SHARDS)


def get_final_outputs():
    """READY (re-audited), the reconciliation and the report; the S3 upload when configured."""
    published = (
        ["results/published.json"]
        if lookup(dpath="merge/output_prefix", within=config)
        else []
    )
    return published + [
        "results/READY.json",
        "results/reconcile.json",
        "results/report/throughput.svg",
    ]


def stop_gpu_servers():
    """Stop the per-GPU servers this run started, per node and per Slurm job (on success and on error)."""
    stop_all_servers(RUN.servers_root)
