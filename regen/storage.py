"""S3 access: URIs, a client from boto3's default chain, journal batch sync, publishing a manifest's files.

Credentials and endpoint come from boto3's default chain only (``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_PROFILE`` / instance roles; ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL`` for an S3-compatible server). Nothing here logs or formats a credential;
authentication failures become a :class:`StorageError` that names the bucket/prefix and what to check.

Journal sync layout (one object per batch, idempotent)::

    {prefix}/journal/{shard}/batch-{n:08d}.jsonl

A batch holds the journal lines appended since the previous batch. Batch ``n`` always holds the same
lines, so re-uploading it is harmless, and a lost node loses at most the batch it had not uploaded yet.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

from regen.io import atomic_path, file_sha256
from regen.journal_lines import FAILED, complete_lines
from regen.layout.names import MANIFEST_NAME, journal_batch
from regen.runconfig import JournalSyncConfig

log = logging.getLogger("regen.storage")

_BATCH_RE = re.compile(r"batch-(\d{8})\.jsonl$")
_AUTH_CODES = frozenset(
    {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken"}
)


class StorageError(RuntimeError):
    """An S3 operation failed; the message names the location and what to check (never a secret)."""


# --------------------------------------------------------------------------- URIs


@dataclass(frozen=True, slots=True)
class S3Location:
    """A bucket and a key (or key prefix, without leading or trailing slash)."""

    bucket: str
    key: str

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}" if self.key else f"s3://{self.bucket}"

    def child(self, *parts: str) -> S3Location:
        """The location ``parts`` below this one, joined with single slashes."""
        pieces = [p.strip("/") for p in (self.key, *parts) if p.strip("/")]
        return S3Location(self.bucket, "/".join(pieces))


def is_s3_uri(s: object) -> bool:
    """True for strings of the form ``s3://bucket[/key]``."""
    return isinstance(s, str) and s.startswith("s3://")


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``; the key keeps a trailing slash if given."""
    if not is_s3_uri(uri):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"s3 URI without a bucket: {uri!r}")
    return bucket, key.lstrip("/")


def parse_location(uri: str) -> S3Location:
    bucket, key = split_s3_uri(uri)
    return S3Location(bucket, key.strip("/"))


# --------------------------------------------------------------------------- client and errors


def s3_client() -> Any:
    """An S3 client from boto3's default credential chain and endpoint settings.

    boto3 (>= 1.28.57) reads ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` itself. Retries use the
    ``standard`` mode (throttling and 5xx are retried with back-off). The client is thread-safe and
    reused while the AWS_* settings it was made from stay the same.
    """
    import boto3  # ~0.1 s: paid only by a run that uses S3, not by every generate job's start
    from botocore.config import Config

    key = tuple(os.environ.get(name) for name in _CLIENT_ENV)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = boto3.session.Session().client(
                "s3",
                config=Config(
                    retries={"mode": "standard", "max_attempts": 8}, connect_timeout=10, read_timeout=60
                ),
            )
            _CLIENTS.clear()  # keep only the client for the current settings
            _CLIENTS[key] = client
        return client


# The settings a client depends on: a change (e.g. other credentials) gives a new client.
_CLIENT_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
)
_CLIENTS: dict[tuple[str | None, ...], Any] = {}
_CLIENTS_LOCK = threading.Lock()


def _redact(text: str) -> str:
    secret = os.environ.get("AWS_SECRET_ACCESS_KEY")
    if secret and len(secret) >= 4:
        text = text.replace(secret, "***")
    return text


def storage_error(exc: Exception, action: str, where: str, client: Any | None = None) -> StorageError:
    """Turn a boto error into a :class:`StorageError` that says what to check, without secrets."""
    endpoint = getattr(getattr(client, "meta", None), "endpoint_url", None) or "the default AWS endpoint"
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        msg = (
            f"{action} {where}: no usable S3 credentials found. Set AWS_ACCESS_KEY_ID and "
            f"AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for endpoint {endpoint}."
        )
    elif isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", "Unknown"))
        detail = str(err.get("Message", "")).strip()
        if code in _AUTH_CODES:
            hint = (
                "the credentials were rejected: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
                f"(or AWS_PROFILE) match the server at {endpoint}, and that they may access this bucket"
            )
        elif code in {"NoSuchBucket", "404"}:
            hint = f"the bucket does not exist at {endpoint}"
        else:
            hint = f"the S3 server at {endpoint} refused the request"
        msg = f"{action} {where} failed with {code}: {hint}" + (f" (server said: {detail})" if detail else "")
    elif isinstance(exc, BotoCoreError):
        msg = (
            f"{action} {where} failed: {exc}. Check AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL "
            f"(now {endpoint}) and the network."
        )
    else:
        msg = f"{action} {where} failed: {exc}"
    return StorageError(_redact(msg))


# --------------------------------------------------------------------------- plain files


#: the user metadata key under which an upload records its file's sha256 (``x-amz-meta-sha256``)
SHA256_METADATA = "sha256"


def upload_file(
    local_path: str | os.PathLike[str], uri: str, client: Any | None = None, sha256: str | None = None
) -> None:
    """Upload one file to ``uri`` (multipart for large files); ``sha256`` is stored with the object, in the
    same PUT, as its ``x-amz-meta-sha256`` (:func:`stored_sha256` reads it back)."""
    client = client or s3_client()
    loc = parse_location(uri)
    extra = {"Metadata": {SHA256_METADATA: sha256}} if sha256 else None
    try:
        client.upload_file(str(local_path), loc.bucket, loc.key, ExtraArgs=extra)
    except (BotoCoreError, ClientError) as exc:
        raise storage_error(exc, f"uploading {local_path} to", loc.uri, client) from exc
    except Exception as exc:  # boto3's transfer manager wraps ClientError in S3UploadFailedError
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, (BotoCoreError, ClientError)):
            raise storage_error(cause, f"uploading {local_path} to", loc.uri, client) from exc
        raise storage_error(exc, f"uploading {local_path} to", loc.uri, client) from exc


def stored_sha256(uri: str, client: Any | None = None) -> str | None:
    """The sha256 an object at ``uri`` was uploaded with (:func:`upload_file`), or None: no such object, or
    one uploaded without it. The metadata came in the object's own PUT, so it names the bytes stored."""
    client = client or s3_client()
    loc = parse_location(uri)
    try:
        head = client.head_object(Bucket=loc.bucket, Key=loc.key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise storage_error(exc, "reading the metadata of", loc.uri, client) from exc
    except BotoCoreError as exc:
        raise storage_error(exc, "reading the metadata of", loc.uri, client) from exc
    return head.get("Metadata", {}).get(SHA256_METADATA)


def download_file(uri: str, local_path: str | os.PathLike[str], client: Any | None = None) -> Path:
    """Download ``uri`` to ``local_path`` atomically (a failure leaves no partial file)."""
    client = client or s3_client()
    loc = parse_location(uri)
    target = Path(local_path)
    try:
        with atomic_path(target) as tmp:
            client.download_file(loc.bucket, loc.key, str(tmp))
    except (BotoCoreError, ClientError) as exc:
        raise storage_error(exc, "downloading", loc.uri, client) from exc
    return target


def list_keys(uri: str, client: Any | None = None) -> list[str]:
    """Every key under the prefix of ``uri`` (``s3://b/p`` lists ``p/...``), sorted."""
    client = client or s3_client()
    loc = parse_location(uri)
    prefix = f"{loc.key}/" if loc.key else ""
    keys: list[str] = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=loc.bucket, Prefix=prefix):
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
    except (BotoCoreError, ClientError) as exc:
        raise storage_error(exc, "listing", loc.uri, client) from exc
    return sorted(keys)


@dataclass(frozen=True, slots=True)
class ManifestedFile:
    """One file a manifest names: its path under the manifest's folder, the sha256 the manifest gives, and
    what it is in the error that a differing file raises (``row s17``, ``part-00000.parquet``)."""

    path: str
    sha256: str
    what: str


@dataclass(frozen=True, slots=True)
class Published:
    """What one publish put where: every object the manifest names, then the manifest (``uris``), and
    those sent this time (``uploaded``: the manifest always; a file already there with the same sha256 not).
    """

    prefix: str
    uris: tuple[str, ...]
    uploaded: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "objects": list(self.uris), "uploaded": list(self.uploaded)}


def publish_manifested(
    root: str | os.PathLike[str],
    files: Sequence[ManifestedFile],
    s3_prefix: str,
    remedy: str,
    client: Any | None = None,
) -> Published:
    """Upload the files a manifest in ``root`` names to ``s3_prefix`` at their paths under ``root``, then
    ``root/_manifest.json`` last, so a reader that finds the manifest finds every file it names.

    Each file is checked against the manifest's sha256 before anything is sent: one that differs stops the
    publish with an error naming it, the manifest and ``remedy``. A file already stored with the same sha256
    (recorded with the object by its own upload, :func:`upload_file`) is not sent again: a rerun after a
    failed upload, or one that changed a few files, sends those and the manifest. Objects under the prefix
    that the manifest does not name (an earlier publish's) are left there and counted in the log."""
    top = Path(root)
    for f in files:
        if file_sha256(top / f.path) != f.sha256:
            raise StorageError(
                f"{top / f.path}: sha256 differs from {top / MANIFEST_NAME} ({f.what}); nothing uploaded: "
                + remedy
            )
    client = client or s3_client()
    base = parse_location(s3_prefix)
    named, sent = [base.child(f.path) for f in files], []
    for f, loc in zip(files, named, strict=True):
        if stored_sha256(loc.uri, client) != f.sha256:
            upload_file(top / f.path, loc.uri, client, sha256=f.sha256)
            sent.append(loc.uri)
    manifest = base.child(MANIFEST_NAME)
    upload_file(top / MANIFEST_NAME, manifest.uri, client, sha256=file_sha256(top / MANIFEST_NAME))
    named.append(manifest)
    log.info(
        "%s: %d files uploaded, %d already there with the same sha256, manifest last; %s",
        base.uri,
        len(sent),
        len(files) - len(sent),
        strays_note(base, {loc.key for loc in named}, client),
    )
    return Published(base.uri, tuple(loc.uri for loc in named), (*sent, manifest.uri))


def strays_note(base: S3Location, named: set[str], client: Any) -> str:
    """What else is under ``base`` besides the ``named`` keys (an earlier publish's objects), for the log;
    credentials that may write but not list get a line saying the count is unknown, not a failed publish."""
    try:
        strays = [k for k in list_keys(base.uri, client) if k not in named]
    except StorageError as exc:
        return f"objects the manifest does not name: not counted ({exc})"
    if not strays:
        return "no other objects there"
    first = S3Location(base.bucket, strays[0]).uri
    return f"{len(strays)} objects there that the manifest does not name are left in place (first: {first})"


# --------------------------------------------------------------------------- journal sync


def batch_key(prefix: S3Location, shard: str, n: int) -> S3Location:
    return prefix.child("journal", shard, journal_batch(n))


def _line_id(line: bytes) -> str | None:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    value = obj.get("id") if isinstance(obj, dict) else None
    return value if isinstance(value, str) else None


def _record_key(line: bytes) -> tuple[str, str | None] | None:
    """(id, fingerprint) of a record line; None for failures (every failure line is attempt history)."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or obj.get("kind") == FAILED or not isinstance(obj.get("id"), str):
        return None
    return obj["id"], obj.get("fingerprint")


def _complete_lines(data: bytes) -> list[bytes]:
    """Lines of a journal, each ending in a newline, under the journal's one torn-line rule
    (``regen.journal_lines.complete_lines``): a torn last line is dropped."""
    lines, end = complete_lines(data)
    if data[end:].strip():
        log.warning("dropping a torn last journal line (%d bytes)", len(data) - end)
    return [raw + b"\n" for _, _, raw in lines]


@dataclass(frozen=True, slots=True)
class RestoreResult:
    """What :meth:`S3JournalSink.restore` did."""

    batches: int  # batch objects found for the shard
    added_lines: int  # lines written into the local journal from S3
    queued_lines: int  # local lines S3 did not have, queued for the next batch
    next_batch: int


class S3JournalSink:
    """Batched, idempotent upload of one shard's journal to S3 (the journal sink protocol).

    ``restore(local_path)`` before the journal is read, then ``on_append(line)`` for each line the
    journal writes, ``flush()`` to upload what is pending and wait, ``close()`` at the end.

    A batch is cut when ``every_records`` lines are pending or the oldest pending line has waited
    ``every_seconds`` (a background thread enforces the time even when no further line arrives); that
    thread uploads it, so ``on_append`` only takes a lock and appends: safe to call from an asyncio
    loop. A failed upload is kept and retried; its error is raised by the next ``on_append``,
    ``flush`` or ``close``.
    """

    def __init__(
        self,
        s3_prefix: str,
        shard: str,
        every_records: int,
        every_seconds: float,
        client: Any | None = None,
    ) -> None:
        if every_records < 1 or every_seconds <= 0:
            raise ValueError("every_records must be >= 1 and every_seconds > 0")
        self.prefix = parse_location(s3_prefix)
        self.shard = shard
        self.every_records = every_records
        self.every_seconds = every_seconds
        self._client = client or s3_client()
        self._cond = threading.Condition()
        self._pending: list[bytes] = []
        self._queue: list[tuple[int, bytes]] = []  # (batch number, body) cut but not yet uploaded
        self._uploading = 0
        self._next_batch = 0
        self._pending_since = time.monotonic()
        self._error: StorageError | None = None
        self._closed = False
        self.uploaded_batches: list[int] = []
        self._thread = threading.Thread(target=self._run, name=f"s3-journal-{shard}", daemon=True)
        self._thread.start()

    @property
    def shard_uri(self) -> str:
        return self.prefix.child("journal", self.shard).uri

    # ---- protocol

    def restore(self, local_path: str | os.PathLike[str]) -> RestoreResult:
        """Merge every uploaded batch of this shard into ``local_path`` (atomically).

        Local lines are kept; an S3 line is added unless the same line, or a record with the same
        sample ``id`` and generation fingerprint, is already local (records of other fingerprints,
        e.g. from a machine with another config, are kept: the journal replays only the current
        fingerprint's). Local lines missing from S3 are queued for the next batch.
        The next batch number follows the highest one found.
        """
        path = Path(local_path)
        batches = self._list_batches()
        remote: list[bytes] = []
        for _n, key in batches:
            remote.extend(_complete_lines(self._get(key)))
        local = _complete_lines(path.read_bytes()) if path.exists() else []
        local_set = set(local)
        local_records = {k for k in map(_record_key, local) if k is not None}
        added: list[bytes] = []
        seen = set(local_set)
        for line in remote:
            key = _record_key(line)
            if line in seen or (key is not None and key in local_records):
                continue
            seen.add(line)
            added.append(line)
        remote_set = set(remote)
        unsynced = [ln for ln in local if ln not in remote_set]
        if added or (path.exists() and path.read_bytes() != b"".join(local)):
            with atomic_path(path) as tmp:
                tmp.write_bytes(b"".join(local + added))
        with self._cond:
            self._next_batch = max(self._next_batch, (batches[-1][0] + 1) if batches else 0)
            if unsynced and not self._pending:
                self._pending_since = time.monotonic()
            self._pending[:0] = unsynced
            self._cond.notify_all()
        result = RestoreResult(len(batches), len(added), len(unsynced), self._next_batch)
        log.info(
            "journal %s restored from %s: %d batches, %d lines added, %d local lines queued",
            path,
            self.shard_uri,
            result.batches,
            result.added_lines,
            result.queued_lines,
        )
        return result

    def on_append(self, line: bytes) -> None:
        """Record one journal line; cuts a batch when ``every_records`` lines are pending."""
        if not line.endswith(b"\n"):
            line += b"\n"
        with self._cond:
            self._raise_if_failed()
            if self._closed:
                raise StorageError(f"journal sink for {self.shard_uri} is closed")
            if not self._pending:  # the clock for every_seconds starts with the first pending line
                self._pending_since = time.monotonic()
                self._cond.notify_all()
            self._pending.append(line)
            if len(self._pending) >= self.every_records:
                self._cut_locked()
                self._cond.notify_all()

    def flush(self) -> None:
        """Upload everything pending and wait until it is stored."""
        with self._cond:
            if self._pending:
                self._cut_locked()
                self._cond.notify_all()
            while (self._queue or self._uploading) and self._error is None:
                self._cond.wait(timeout=1.0)
            self._raise_if_failed()

    def close(self) -> None:
        """Flush, then stop the upload thread. Safe to call twice."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            self._thread.join(timeout=30)

    def __enter__(self) -> S3JournalSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _cut_locked(self) -> None:
        self._queue.append((self._next_batch, b"".join(self._pending)))
        self._next_batch += 1
        self._pending = []

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    due = self._pending_since + self.every_seconds
                    now = time.monotonic()
                    if self._pending and now >= due:
                        self._cut_locked()
                        break
                    self._cond.wait(timeout=max(0.01, min(due - now, 1.0)) if self._pending else 5.0)
                if not self._queue:
                    return  # closed and nothing left
                n, body = self._queue[0]
                self._uploading += 1
            try:
                self._put(batch_key(self.prefix, self.shard, n), body)
                failure: StorageError | None = None
            except StorageError as exc:
                failure = exc
            with self._cond:
                self._uploading -= 1
                if failure is None:
                    self._queue.pop(0)
                    self.uploaded_batches.append(n)
                    self._error = None
                else:
                    self._error = failure
                    log.error("%s", failure)
                self._cond.notify_all()
            if failure is not None:
                with self._cond:  # back off before retrying; close() ends the wait
                    if self._cond.wait_for(lambda: self._closed, timeout=min(self.every_seconds, 5.0)):
                        return

    def _put(self, loc: S3Location, body: bytes) -> None:
        try:
            self._client.put_object(Bucket=loc.bucket, Key=loc.key, Body=body)
        except (BotoCoreError, ClientError) as exc:
            raise storage_error(exc, "uploading journal batch to", loc.uri, self._client) from exc

    def _get(self, loc: S3Location) -> bytes:
        try:
            return self._client.get_object(Bucket=loc.bucket, Key=loc.key)["Body"].read()
        except (BotoCoreError, ClientError) as exc:
            raise storage_error(exc, "downloading journal batch", loc.uri, self._client) from exc

    def _list_batches(self) -> list[tuple[int, S3Location]]:
        base = self.prefix.child("journal", self.shard)
        found: list[tuple[int, S3Location]] = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=base.bucket, Prefix=f"{base.key}/"
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    m = _BATCH_RE.search(obj["Key"])
                    if m:
                        found.append((int(m.group(1)), S3Location(base.bucket, obj["Key"])))
        except (BotoCoreError, ClientError) as exc:
            raise storage_error(exc, "listing journal batches under", base.uri, self._client) from exc
        return sorted(found, key=lambda item: item[0])


def sink_from_config(sync_cfg: JournalSyncConfig, shard: str) -> S3JournalSink | None:
    """The sink for ``generate.journal_sync`` (None when ``s3_prefix`` is null)."""
    prefix = sync_cfg.s3_prefix
    if not prefix:
        return None
    if not is_s3_uri(prefix):
        raise StorageError(f"generate.journal_sync.s3_prefix must be an s3:// URI, got {prefix!r}")
    return S3JournalSink(
        prefix,
        shard,
        every_records=sync_cfg.every_records,
        every_seconds=sync_cfg.every_seconds,
    )
