"""The stage sections of the run config, typed: defaults and rules only from the schema.

``dataset``, ``audit``, ``validate``, ``merge``, ``reaudit`` and ``export`` are each typed in the stage
module that owns them, by a ``from_dict`` that fills the schema's defaults and validates against it
(``regen.runconfig.validated``); a bad value is refused naming ``section.field``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from regen.ingest.audit import FLAG_NAMES, AuditConfig
from regen.ingest.dataset import DatasetConfig
from regen.output.export import ExportConfig
from regen.output.merge import MergeConfig
from regen.output.reaudit import ReauditGates
from regen.output.validate import ValidateConfig
from regen.runconfig import ConfigError, section_schema

#: the typed stage sections and the schema section each types
SECTIONS: list[tuple[type, str]] = [
    (DatasetConfig, "dataset"),
    (AuditConfig, "audit"),
    (ValidateConfig, "validate"),
    (MergeConfig, "merge"),
    (ReauditGates, "reaudit"),
    (ExportConfig, "export"),
]


def schema_defaults(schema: dict[str, Any]) -> dict[str, Any]:
    """Every property's default, nested objects as their own property defaults."""
    out = {}
    for key, prop in schema["properties"].items():
        if prop.get("properties"):
            out[key] = schema_defaults(prop)
        elif "default" in prop:
            out[key] = prop["default"]
    return out


@pytest.mark.parametrize(("cls", "section"), [s for s in SECTIONS if s[1] not in ("audit", "export")])
def test_a_flat_section_is_the_schema_s_defaults_when_empty(cls: type, section: str) -> None:
    assert dataclasses.asdict(cls.from_dict({})) == schema_defaults(section_schema(section))
    assert dataclasses.asdict(cls.from_dict(None)) == schema_defaults(section_schema(section))


def test_the_audit_section_is_the_schema_s_defaults_when_empty() -> None:
    want = schema_defaults(section_schema("audit"))
    got = AuditConfig.from_dict({})
    assert (got.context_limit, got.scaffolding_max_tokens, got.override_gates) == (
        want["context_limit"],
        want["scaffolding_max_tokens"],
        want["override_gates"],
    )
    assert got.gates == want["gates"] and got.exclude == frozenset(want["exclude"])
    assert got.exclude <= set(FLAG_NAMES)  # the schema's flags are the audit's
    assert got.decontamination.ngram == want["decontamination"]["ngram"]
    assert got.decontamination.benchmarks == () == tuple(want["decontamination"]["benchmarks"])
    assert got.regenerate is None  # not given: the summary says the schema's default was assumed
    assert AuditConfig.from_dict({}, "all").regenerate == "all"


def test_the_export_section_is_the_schema_s_defaults_when_empty() -> None:
    want = schema_defaults(section_schema("export"))
    got = ExportConfig.from_dict({})
    fields = {f.name: getattr(got, f.name) for f in dataclasses.fields(got) if f.name != "policy"}
    assert {**fields, **dataclasses.asdict(got.policy)} == want


def test_a_given_value_wins_over_the_default() -> None:
    assert ValidateConfig.from_dict({"max_content_chars": 7}).max_content_chars == 7
    merged = MergeConfig.from_dict({"rows_per_row_group": 3, "output_prefix": "s3://b/p"})
    assert (merged.rows_per_row_group, merged.output_prefix) == (3, "s3://b/p")
    assert ReauditGates.from_dict({"min_rows": 0, "override_gates": True}).min_rows == 0
    assert DatasetConfig.from_dict({"path": "x.jsonl", "id_column": "id"}).id_column == "id"
    audit = AuditConfig.from_dict({"gates": {"max_unread_tail_files": 2}})
    assert audit.gates["max_unread_tail_files"] == 2
    assert (
        audit.gates["max_over_length_fraction"]
        == schema_defaults(section_schema("audit"))["gates"]["max_over_length_fraction"]
    )
    assert ExportConfig.from_dict({"include_truncated": True}).policy.include_truncated


@pytest.mark.parametrize(
    ("cls", "raw", "where"),
    [
        (DatasetConfig, {"format": "chatml"}, r"^dataset\.format: "),
        (DatasetConfig, {"on_bad_row": "ignore"}, r"^dataset\.on_bad_row: "),
        (AuditConfig, {"context_limit": 0}, r"^audit\.context_limit: "),
        (
            AuditConfig,
            {"gates": {"max_over_length_fraction": 2}},
            r"^audit\.gates\.max_over_length_fraction: ",
        ),
        (AuditConfig, {"gates": {"max_typo_fraction": 0.1}}, r"^audit\.gates: .*max_typo_fraction"),
        (AuditConfig, {"exclude": ["nope"]}, r"^audit\.exclude\.0: "),
        (AuditConfig, {"decontamination": {"ngram": 0}}, r"^audit\.decontamination\.ngram: "),
        (ValidateConfig, {"max_content_chars": 0}, r"^validate\.max_content_chars: "),
        (ValidateConfig, {"quarantine_truncated": "yes"}, r"^validate\.quarantine_truncated: "),
        (MergeConfig, {"rows_per_row_group": 0}, r"^merge\.rows_per_row_group: "),
        (MergeConfig, {"include_token_ids": 1}, r"^merge\.include_token_ids: "),
        (ReauditGates, {"max_truncated_fraction": 1.5}, r"^reaudit\.max_truncated_fraction: "),
        (ReauditGates, {"min_rows": -1}, r"^reaudit\.min_rows: "),
        (ExportConfig, {"over_max_length": "truncate"}, r"^export\.over_max_length: "),
        (ExportConfig, {"eval_fraction": -0.1}, r"^export\.eval_fraction: "),
    ],
)
def test_a_bad_value_is_refused_naming_section_and_field(cls: type, raw: dict, where: str) -> None:
    with pytest.raises(ConfigError, match=where):
        cls.from_dict(raw)


@pytest.mark.parametrize(("cls", "section"), SECTIONS)
def test_an_unknown_key_is_refused_naming_the_section(cls: type, section: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{section}\.\(section\): .*not_a_key"):
        cls.from_dict({"not_a_key": 1})


def test_the_regenerate_mode_given_with_the_audit_section_is_checked() -> None:
    with pytest.raises(ValueError, match=r"generate\.regenerate: 'some'"):
        AuditConfig.from_dict({}, "some")


@pytest.mark.parametrize(("cls", "section"), SECTIONS)
def test_a_typed_section_writes_no_default_of_its_own(cls: type, section: str) -> None:
    """Every field is set by ``from_dict`` from the filled section: none has a dataclass default that could
    drift from the schema's, and every key of the schema section reaches the typed object."""
    declared = {f.name: f for f in dataclasses.fields(cls)}
    with_default = [
        name
        for name, f in declared.items()
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    ]
    assert with_default == [], with_default
    keys = set(section_schema(section)["properties"])
    if cls is ExportConfig:  # the mask settings are typed once, as the export's MaskPolicy
        keys -= {f.name for f in dataclasses.fields(ExportConfig.from_dict({}).policy)}
        keys.add("policy")
    assert set(declared) - {"regenerate"} == keys  # regenerate: generate.regenerate, given beside the section
